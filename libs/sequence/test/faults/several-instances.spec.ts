import { bytes, eventually, metricValue } from '../support/sequence-test-app';
import { InstrumentedStore } from '../guarantees/instrumented.sequence-store';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { useFaultServersOn } from './support/fault-servers';
import { keysUnder } from '../support/redis.fixture';
import { describeOnTransports } from '../support/transports.fixture';

jest.setTimeout(30_000);

/**
 * Guarantees table, row "several consumer instances", on the real servers: two Nest applications
 * in this process, each with its own broker connection and its own Redis client, consume one
 * channel and share one Redis key prefix.
 */
describeOnTransports(
  'faults: two consumer instances on one channel and one Redis',
  ['redis'],
  (on) => {
    const apps: RealServersApp[] = [];
    const servers = useFaultServersOn(on, {
      beforeCleanup: async () => {
        for (const app of apps.splice(0)) await app.close();
      },
    });

    it('store fragments of every sequence on both instances, complete each sequence exactly once, byte-exact, and dead-letter nothing', async () => {
      const channel = servers.admin.newChannel();
      const stores: InstrumentedStore[] = [];
      for (let i = 0; i < 2; i++) {
        apps.push(
          await createRealServersApp(channel, {
            on,
            prefix: servers.prefix,
            // Fragments of 8,000 bytes: a maxFragmentBytes to match keeps the prefetch at 16, so
            // that an instance slow to start still takes its share of every sequence.
            handler: { maxFragmentBytes: 64 * 1024 },
            wrapStore: (store) => {
              const counted = new InstrumentedStore(store);
              stores.push(counted);
              return counted;
            },
          }),
        );
      }
      const [first, second] = apps;
      // Both instances consuming and both stores answering before anything is sent: an instance
      // still connecting would sit on its prefetch while the other took whole sequences.
      await eventually(
        async () => (await servers.admin.consumerCount(channel)) >= 2,
        'both instances consuming',
      );
      for (const store of stores) await store.stats(Date.now());
      const sequences = Array.from({ length: 8 }, (_, i) => ({
        id: `two-instances-${i}`,
        payload: bytes(121_000 + i * 1_000, 70 + i),
      }));

      // Sent at once by one producer: the channel interleaves the sequences' fragments, and the
      // broker hands them out to both consumers in turn.
      const receipts = await Promise.all(
        sequences.map(({ id, payload }) =>
          first.splitter.send(channel, payload, { sequenceId: id, fragmentBytes: 8_000 }),
        ),
      );
      expect(receipts.map((r) => r.fragments)).toEqual(sequences.map(() => 16));

      const deliveriesOf = (id: string) => apps.flatMap((app) => app.handler.of(id));
      await eventually(
        () => sequences.every(({ id }) => deliveriesOf(id).length > 0),
        'every sequence delivered',
        20_000,
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the channel drained',
      );

      for (const { id, payload } of sequences) {
        const deliveries = deliveriesOf(id);
        expect(deliveries).toHaveLength(1);
        expect(deliveries[0].bytes.equals(payload)).toBe(true);
        // Both instances stored fragments of it; together they stored each position exactly once.
        for (const store of stores) expect(store.storedPositions(id).length).toBeGreaterThan(0);
        const positions = stores
          .flatMap((store) => store.storedPositions(id))
          .sort((a, b) => a - b);
        expect(positions).toEqual(Array.from({ length: 16 }, (_, i) => i + 1));
      }
      for (const app of [first, second]) {
        expect(
          await metricValue(app.metrics.registry, 'nest_sequence_fragments_received_total', {
            channel,
          }),
        ).toBeGreaterThan(0);
      }
      // A handler's delivery is recorded as it returns, its completion once the marker is
      // written: the last sequences' markers may still be on their way.
      const completed = async () =>
        (
          await Promise.all(
            apps.map((app) =>
              metricValue(app.metrics.registry, 'nest_sequence_sequences_completed_total', {
                channel,
              }),
            ),
          )
        ).reduce((sum, count) => sum + count, 0);
      await eventually(
        async () => (await completed()) >= sequences.length,
        'every sequence marked completed',
      );
      expect(await completed()).toBe(sequences.length);
      expect(first.handler.calls + second.handler.calls).toBe(sequences.length);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);

      // What is left in Redis: one completion marker per sequence and the store-wide index.
      const left = await keysUnder(servers.redis, servers.prefix);
      expect(left.filter((key) => /:(meta|crc|body)$/.test(key))).toEqual([]);
      expect(left.filter((key) => key.endsWith(':done')).sort()).toEqual(
        sequences.map(({ id }) => `${servers.prefix}:{seq:${channel}:${id}}:done`).sort(),
      );
    });
  },
);
