import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sha256Hex } from '../../src/core/checksum';
import { SERVERS } from '../support/servers';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';
import {
  ConsumerProcess,
  consumerLauncher,
  type ConsumerEvent,
} from '../support/processes/consumer-process';
import { useFaultServersOn } from './support/fault-servers';
import { crcKey, keysUnder } from '../support/redis.fixture';
import { describeOnTransports } from '../support/transports.fixture';

jest.setTimeout(40_000);

/**
 * Guarantees table, row "consumer crash", with a real process: the consumer runs in a child
 * process (fixtures/consumer.process.ts) that the test kills with SIGKILL, so nothing of it gets
 * to settle, close or clean up, then starts again.
 */
describeOnTransports(
  'faults: a consumer process killed with SIGKILL mid-sequence',
  ['redis'],
  (on) => {
    let channel: string;
    let dir: string;
    const consumers: ConsumerProcess[] = [];
    const servers = useFaultServersOn(on, {
      producer: true,
      beforeCleanup: async () => {
        for (const consumer of consumers.splice(0)) await consumer.kill();
      },
    });

    beforeEach(() => {
      channel = servers.admin.newChannel();
      dir = mkdtempSync(join(tmpdir(), 'nseq-fault-consumer-'));
    });

    afterEach(async () => {
      rmSync(dir, { recursive: true, force: true });
    });

    const launch = consumerLauncher(
      () => ({ on, redisUrl: SERVERS.redis.url, channel, prefix: servers.prefix, dir }),
      consumers,
    );
    const startConsumer = launch.start;
    /**
     * The process a restart runs, spawned ahead: it loads its code meanwhile, and connects only on
     * `go()`. A restart then takes what connecting and subscribing take, not the second or two of a
     * process's start as well.
     */
    const spawnRestart = launch.held;

    const eventsOf = (events: ConsumerEvent[], event: ConsumerEvent['event'], sequenceId: string) =>
      events.filter((e) => e.event === event && e.sequenceId === sequenceId);

    it('keeps the fragments stored before the kill; after a restart the sequence completes once, byte-exact', async () => {
      const payload = bytes(256_000, 81);
      const fragments = makeFragments('killed-between-fragments', payload, 16_000);
      expect(fragments).toHaveLength(16);
      const killed = await startConsumer();
      const restarting = spawnRestart();

      await publishAll(servers.producer, channel, fragments.slice(0, 8));
      await eventually(
        async () =>
          (await servers.redis.hlen(
            crcKey(servers.prefix, channel, 'killed-between-fragments'),
          )) === 8,
        'the first 8 fragments stored in Redis',
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the channel drained',
      );
      await killed.kill();
      // Until the broker has seen the connection go, it may still hand a message to the killed
      // consumer (on NATS, to a pull request the process left open).
      await eventually(
        async () => (await servers.admin.consumerCount(channel)) === 0,
        'the killed consumer gone from the broker',
      );

      await publishAll(servers.producer, channel, fragments.slice(8));
      // Nobody consumes now: the rest waits on the channel (plus, on RabbitMQ, any stored fragment
      // whose ack the killed process had not sent yet).
      expect(await servers.admin.readyCount(channel)).toBeGreaterThanOrEqual(8);
      expect(
        await servers.redis.hlen(crcKey(servers.prefix, channel, 'killed-between-fragments')),
      ).toBe(8);

      const restarted = await restarting.go();
      await restarted.waitFor(
        (events) => eventsOf(events, 'delivered', 'killed-between-fragments').length > 0,
        'the sequence delivered after the restart',
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the channel drained',
      );
      // Late duplicates are recognised by the completion marker, not delivered again.
      await publishAll(servers.producer, channel, fragments.slice(0, 2));
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the duplicates taken',
      );
      await new Promise((resolve) => setTimeout(resolve, 200));

      const events = restarted.events();
      const delivered = eventsOf(events, 'delivered', 'killed-between-fragments');
      expect(delivered).toEqual([
        {
          event: 'delivered',
          sequenceId: 'killed-between-fragments',
          bytes: payload.length,
          sha256: sha256Hex(payload),
          fragments: 16,
          pid: restarted.pid,
          at: expect.any(Number),
        },
      ]);
      expect(eventsOf(events, 'started', 'killed-between-fragments')).toHaveLength(1);
      const written = readFileSync(join(dir, `killed-between-fragments.${restarted.pid}.bin`));
      expect(written.equals(payload)).toBe(true);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
      const left = await keysUnder(servers.redis, servers.prefix);
      expect(left.filter((key) => /:(meta|crc|body)$/.test(key))).toEqual([]);
      expect(
        await servers.redis.hget(
          `${servers.prefix}:{seq:${channel}:killed-between-fragments}:done`,
          'outcome',
        ),
      ).toBe('completed');
    });

    it('redelivers a sequence whose handler was running when the process was killed: the restarted consumer delivers it once the lease lapses', async () => {
      const payload = bytes(64_000, 82);
      const fragments = makeFragments('killed-in-handler', payload, 16_000);
      // Two thirds of it longer than a restart takes (its process spawned ahead: 1 to 2 s here)
      // and than NATS takes to deliver the killed process's message again (its ack_wait, 2 s), so
      // that the wait for the lease shows.
      const leaseMs = 5_000;
      const killed = await startConsumer({ leaseMs, handlerSleepMs: 60_000 });
      const restarting = spawnRestart({ leaseMs });

      await publishAll(servers.producer, channel, fragments);
      await killed.waitFor(
        (events) => eventsOf(events, 'started', 'killed-in-handler').length === 1,
        'the handler running in the first process',
      );
      await killed.kill();
      const killedAt = Date.now();

      const restarted = await restarting.go();
      await restarted.waitFor(
        (events) => eventsOf(events, 'delivered', 'killed-in-handler').length > 0,
        'the sequence delivered after the restart',
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the channel drained',
      );
      await new Promise((resolve) => setTimeout(resolve, 200));

      const events = restarted.events();
      const starts = eventsOf(events, 'started', 'killed-in-handler');
      // The killed process started the handler and never finished it: the sequence was delivered
      // (handler run to the end) exactly once, by the restarted process.
      expect(starts.map((e) => e.pid)).toEqual([killed.pid, restarted.pid]);
      const delivered = eventsOf(events, 'delivered', 'killed-in-handler');
      expect(delivered.map(({ pid, sha256, bytes: length }) => ({ pid, sha256, length }))).toEqual([
        { pid: restarted.pid, sha256: sha256Hex(payload), length: payload.length },
      ]);
      expect(
        readFileSync(join(dir, `killed-in-handler.${restarted.pid}.bin`)).equals(payload),
      ).toBe(true);
      // Taken over only once the dead holder's lease lapsed: it was renewed every leaseMs / 3 until
      // the kill, so it ran at least 2/3 of leaseMs beyond it.
      expect(starts[1].at - killedAt).toBeGreaterThanOrEqual((leaseMs * 2) / 3 - 100);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });
  },
);
