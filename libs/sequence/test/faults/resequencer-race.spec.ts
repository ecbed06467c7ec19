import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { SERVERS } from '../support/servers';
import { eventually, shuffled } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { AMQP_URL } from '../support/rabbitmq.fixture';
import { describeOnRealServers } from './support/real-servers';
import { keysUnder } from '../support/redis.fixture';
import { publishKeyedEvents } from './support/resequencer-app';
import { ResequencerConsumerProcess } from '../support/processes/resequencer-consumer-process';
import { defaultBodyOf, QueueCollector } from './support/resequencer-output';

jest.setTimeout(120_000);

const KEYS = 1_000;
const EVENTS_PER_KEY = 5;
const INSTANCES = 3;
/** Every 20th event is published a second time, at another random place in the stream. */
const DUPLICATE_EVERY = 20;
/** Publishes in flight at once (each waits for its confirm). */
const PUBLISH_CONCURRENCY = 200;

/**
 * Guarantees table, row "several consumer instances", for the Resequencer: three consumers, each
 * a process of its own (real parallelism: its own event loop, AMQP connection and Redis client),
 * take events of 1,000 keys from one queue in whatever order the broker hands them out, and share
 * one Redis store. Whichever instance accepts an event, each key's events must come out of the
 * output channel strictly in order, each exactly once.
 */
describeOnRealServers('faults: three Resequencer processes race on one queue', () => {
  let dir: string;
  const consumers: ResequencerConsumerProcess[] = [];
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      for (const consumer of consumers.splice(0)) await consumer.kill();
    },
  });

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'nseq-fault-rsq-race-'));
  });

  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it.each([
    ['one publish of a key at a time (outputInFlight 1, the default)', 1],
    ['up to 4 publishes of a key awaiting confirms (outputInFlight 4)', 4],
  ])(
    'delivers each of 1,000 keys strictly in order 1..5 to the output, nothing lost, nothing twice: %s',
    async (_case, outputInFlight) => {
      const channel = servers.admin.newChannel();
      const output = servers.admin.newChannel();
      consumers.push(
        ...(await Promise.all(
          Array.from({ length: INSTANCES }, () =>
            ResequencerConsumerProcess.start({
              amqpUrl: AMQP_URL,
              redisUrl: SERVERS.redis.url,
              channel,
              output,
              prefix: servers.prefix,
              dir,
              prefetch: 32,
              sweepIntervalMs: 200,
              outputInFlight,
            }),
          ),
        )),
      );

      const events = Array.from({ length: KEYS }, (_, key) =>
        Array.from({ length: EVENTS_PER_KEY }, (__, i) => ({ key: `K${key}`, seq: i + 1 })),
      ).flat();
      const copies = events.filter((_, i) => i % DUPLICATE_EVERY === 0);
      const stream = shuffled([...events, ...copies], 29);
      await publishKeyedEvents(servers.producer, channel, stream, PUBLISH_CONCURRENCY);

      const reader = new QueueCollector(servers.admin, output);
      await reader.atLeast(events.length, 'every event on the output', 40_000);
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the input drained',
      );
      const stats = await Promise.all(consumers.splice(0).map((consumer) => consumer.stop()));
      await reader.collect(); // anything published late would show up now

      expect(reader.messages.length).toBe(events.length);
      const byKey = reader.seqsByKey();
      expect(byKey.size).toBe(KEYS);
      const strictlyInOrder = Array.from({ length: EVENTS_PER_KEY }, (_, i) => i + 1);
      const outOfOrder = [...byKey].filter(([, seqs]) => !sameSeqs(seqs, strictlyInOrder));
      expect(outOfOrder).toEqual([]);
      // Byte-exact bodies, and no header but the key and sequence (no transport header of a
      // requeued copy leaked through).
      const altered = reader.messages.filter(
        (message) =>
          message.body.toString() !== defaultBodyOf(message) ||
          Object.keys(message.headers).sort().join() !== 'x-resequence-key,x-resequence-seq',
      );
      expect(altered).toEqual([]);

      // Every instance took part in the race, and together they delivered each event exactly once.
      for (const { outcomes, delivered } of stats) {
        expect(outcomes?.released ?? 0).toBeGreaterThan(0);
        expect(delivered).toBeGreaterThan(0);
      }
      expect(stats.reduce((sum, { delivered = 0 }) => sum + delivered, 0)).toBe(events.length);
      // The order above was kept with the window in use as configured: at most outputInFlight
      // publishes of a key awaiting confirms at once, and that many at some point (with 4, a
      // key's released run went out without waiting for each confirm).
      const mostInFlight = Math.max(...stats.map(({ maxKeyInFlight = 0 }) => maxKeyInFlight));
      expect(mostInFlight).toBe(outputInFlight);
      const dropped = stats.reduce(
        (sum, { outcomes = {} }) => sum + (outcomes.duplicate ?? 0) + (outcomes.late ?? 0),
        0,
      );
      expect(dropped).toBeGreaterThanOrEqual(copies.length);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);

      // Nothing left behind in Redis: every key at 6, no buffer, no hand-off list.
      const store = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
      const states = await Promise.all(
        [...byKey.keys()].map((key) => store.inspect({ scope: channel, key }, 1)),
      );
      expect(states.filter((state) => state.next !== 6 || state.handOff !== 0)).toEqual([]);
      expect(await store.bufferedTotal(channel)).toBe(0);
      const left = await keysUnder(servers.redis, servers.prefix);
      expect(left.filter((key) => /:(buffer|handoff)$/.test(key))).toEqual([]);
    },
  );
});

function sameSeqs(actual: readonly number[], expected: readonly number[]): boolean {
  return actual.length === expected.length && actual.every((seq, i) => seq === expected[i]);
}
