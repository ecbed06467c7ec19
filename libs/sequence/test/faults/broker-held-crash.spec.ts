import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sha256Hex } from '../../src/core/checksum';
import { SERVERS } from '../support/servers';
import { bytes, eventually, makeFragments, publishHeld } from '../support/sequence-test-app';
import {
  ConsumerProcess,
  consumerLauncher,
  type ConsumerEvent,
} from '../support/processes/consumer-process';
import { useFaultServersOn } from './support/fault-servers';
import { keysUnder } from '../support/redis.fixture';
import { describeOnTransports } from '../support/transports.fixture';

jest.setTimeout(60_000);

const PARTITIONS = 2;

/**
 * Broker-held reassembly on the real servers, with consumers in processes of their own that the
 * test kills with SIGKILL: the partition moves to the other instance, which gets the unacked
 * fragments again and completes the sequence once.
 */
describeOnTransports('faults: broker-held reassembly, a consumer killed', ['redis'], (on) => {
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
    servers.admin.partitioned(channel, PARTITIONS);
    dir = mkdtempSync(join(tmpdir(), 'nseq-fault-held-'));
  });

  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  const launch = consumerLauncher(
    () => ({
      on,
      redisUrl: SERVERS.redis.url,
      channel,
      prefix: servers.prefix,
      dir,
      buffer: 'broker' as const,
      partitions: PARTITIONS,
    }),
    consumers,
  );
  const startConsumer = launch.start;
  /** Spawned at once, loading its code; it connects and consumes only on `go()`. */
  const spawnHeld = launch.held;

  /** Both processes write one results file: each one's own lines are told apart by pid. */
  const eventsOf = (
    of: ConsumerProcess,
    events: ConsumerEvent[],
    event: ConsumerEvent['event'],
    sequenceId: string,
  ) => events.filter((e) => e.pid === of.pid && e.event === event && e.sequenceId === sequenceId);

  it('completes a sequence once on the other instance after the holder is killed mid-sequence', async () => {
    const sequenceId = 'held-killed-mid-sequence';
    const payload = bytes(256_000, 91);
    const fragments = makeFragments(sequenceId, payload, 16_000);
    // Started together: which one becomes the partition's consumer does not matter here.
    const [first, second] = await Promise.all([startConsumer(), startConsumer()]);

    await publishHeld(servers.producer, channel, fragments.slice(0, 8), PARTITIONS);
    // One of them is the partition's active consumer and holds the first eight, unacked.
    const holder = await Promise.race([
      first
        .waitFor(
          (e) => eventsOf(first, e, 'accepted', sequenceId).length === 8,
          'first holds eight',
        )
        .then(() => first),
      second
        .waitFor(
          (e) => eventsOf(second, e, 'accepted', sequenceId).length === 8,
          'second holds eight',
        )
        .then(() => second),
    ]);
    const other = holder === first ? second : first;
    expect(eventsOf(other, other.events(), 'accepted', sequenceId)).toEqual([]);
    await holder.kill();

    await publishHeld(servers.producer, channel, fragments.slice(8), PARTITIONS);
    await other.waitFor(
      (events) => eventsOf(other, events, 'delivered', sequenceId).length > 0,
      'the sequence delivered by the other instance',
    );
    // Late duplicates after completion are recognised by the marker, not delivered again.
    await publishHeld(servers.producer, channel, fragments.slice(0, 2), PARTITIONS);
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 0,
      'no dead letters',
    );
    await new Promise((resolve) => setTimeout(resolve, 500));

    const delivered = eventsOf(other, other.events(), 'delivered', sequenceId);
    expect(
      delivered.map(({ pid, sha256, bytes: length, fragments: count }) => ({
        pid,
        sha256,
        length,
        count,
      })),
    ).toEqual([{ pid: other.pid, sha256: sha256Hex(payload), length: payload.length, count: 16 }]);
    expect(readFileSync(join(dir, `${sequenceId}.${other.pid}.bin`)).equals(payload)).toBe(true);
    // Every fragment of the first eight reached the other instance again after the kill.
    const accepted = eventsOf(other, other.events(), 'accepted', sequenceId).map((e) => e.position);
    expect(new Set(accepted)).toEqual(new Set(fragments.map((_, index) => index + 1)));
    // The bytes never went through Redis: only the completion marker is there.
    const keys = await keysUnder(servers.redis, servers.prefix);
    expect(keys.filter((key) => /:(meta|crc|body)$/.test(key))).toEqual([]);
    expect(
      await servers.redis.hget(`${servers.prefix}:{seq:${channel}:${sequenceId}}:done`, 'outcome'),
    ).toBe('completed');
  });

  it('runs the handler again on the other instance when the holder is killed in it, and completes once', async () => {
    const sequenceId = 'held-killed-in-handler';
    const payload = bytes(64_000, 92);
    const fragments = makeFragments(sequenceId, payload, 16_000);
    // Both load their code at once; the first consumes first, so the partition is its own.
    const first = spawnHeld({ handlerSleepMs: 60_000 });
    const second = spawnHeld({ handlerSleepMs: 0 });
    await first.go();
    await second.go();

    await publishHeld(servers.producer, channel, fragments, PARTITIONS);
    await first.waitFor(
      (events) => eventsOf(first, events, 'started', sequenceId).length === 1,
      'the handler running in the first process',
    );
    await first.kill();
    await second.waitFor(
      (events) => eventsOf(second, events, 'delivered', sequenceId).length > 0,
      'the sequence delivered by the second process',
    );
    await new Promise((resolve) => setTimeout(resolve, 300));

    const all = second.events();
    expect(all.filter((e) => e.event === 'delivered' && e.sequenceId === sequenceId)).toHaveLength(
      1,
    );
    expect(eventsOf(second, all, 'delivered', sequenceId)).toHaveLength(1);
    expect(readFileSync(join(dir, `${sequenceId}.${second.pid}.bin`)).equals(payload)).toBe(true);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
