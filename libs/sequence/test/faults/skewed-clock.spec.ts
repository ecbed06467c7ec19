import { mkdtempSync, rmSync } from 'node:fs';
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
import { describeOnTransports } from '../support/transports.fixture';

jest.setTimeout(60_000);

/**
 * Two consumer processes share one channel and one Redis; the clock of one of them (`Date.now`,
 * which its module reads `now` from) runs a minute ahead, longer than the completion lease. The
 * leases on the shared store must hold on Redis's clock, whatever each machine's says.
 */
describeOnTransports(
  'faults: two consumer processes, one with a clock a minute ahead',
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
      dir = mkdtempSync(join(tmpdir(), 'nseq-fault-clock-'));
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
        leaseMs: 30_000,
      }),
      consumers,
    );
    const startConsumer = launch.start;
    /** Spawned ahead, its code loaded: it connects on `go()`, within moments. */
    const spawnHeld = launch.held;

    const eventsOf = (events: ConsumerEvent[], event: ConsumerEvent['event'], sequenceId: string) =>
      events.filter((e) => e.event === event && e.sequenceId === sequenceId);

    it('the instance whose clock runs ahead does not run a handler a second time while the other runs it', async () => {
      const sequenceId = 'clock-ahead';
      const payload = bytes(64_000, 91);
      const fragments = makeFragments(sequenceId, payload, 16_000);
      // The handler's run is the window in which the other instance must not run it: long enough
      // for that one to connect (spawned ahead) and take the resent fragments, which takes a
      // second or two.
      const onTime = await startConsumer({ handlerSleepMs: 6_000 });
      const spawned = spawnHeld({ clockSkewMs: 60_000 });

      await publishAll(servers.producer, channel, fragments);
      await onTime.waitFor(
        (events) => eventsOf(events, 'started', sequenceId).length === 1,
        'the handler running on the instance whose clock is right',
      );
      const early = await spawned.go();
      // The producer sends the sequence again (a retry): both instances get its fragments while
      // the handler still runs.
      await publishAll(servers.producer, channel, fragments);

      await onTime.waitFor(
        (events) => eventsOf(events, 'delivered', sequenceId).length === 1,
        'the sequence delivered',
        30_000,
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the resent fragments taken',
      );

      const events = onTime.events();
      expect(eventsOf(events, 'started', sequenceId)).toEqual([
        expect.objectContaining({ pid: onTime.pid }),
      ]);
      expect(eventsOf(events, 'delivered', sequenceId)).toEqual([
        expect.objectContaining({ pid: onTime.pid, sha256: sha256Hex(payload) }),
      ]);
      expect(events.filter((e) => e.pid === early.pid && e.event !== 'ready')).toEqual([]);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });
  },
);
