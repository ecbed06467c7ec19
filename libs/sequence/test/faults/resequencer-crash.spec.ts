import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { SERVERS } from '../support/servers';
import { eventually } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { AMQP_URL } from '../support/rabbitmq.fixture';
import { describeOnRealServers } from './support/real-servers';
import { publishKeyedEvent } from './support/resequencer-app';
import {
  ResequencerConsumerProcess,
  type ResequencerConsumerEvent,
  type ResequencerConsumerSettings,
} from '../support/processes/resequencer-consumer-process';
import { defaultBodyOf, QueueCollector } from './support/resequencer-output';

jest.setTimeout(120_000);

/** Short, so that the survivor takes the dead drainer's lease over quickly. */
const LEASE_MS = 1_000;
/** Published in this order; K:3 is where the first drainer to reach it hangs. */
const EVENTS = [
  ['K', 1],
  ['L', 1],
  ['K', 2],
  ['L', 2],
  ['K', 3],
  ['L', 3],
  ['K', 4],
  ['K', 5],
] as const;

/**
 * Guarantees table, row "consumer crash", for the Resequencer. Two consumer processes share the
 * queue and Redis; the one that first delivers a chosen event hangs in its handler (called after
 * the output publish), and is killed with SIGKILL there: after the store released the event into
 * the key's hand-off list and after it went out, but before its delivery settled. The hand-off
 * list still holds it: once the dead drainer's lease lapses, the survivor delivers it again and
 * then the rest of the key, in order. Delivery is at least once, and the tests pin down exactly
 * which repeats are allowed.
 */
describeOnRealServers('faults: a Resequencer process killed between release and delivery', () => {
  let channel: string;
  let output: string;
  let dir: string;
  const consumers: ResequencerConsumerProcess[] = [];
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      for (const consumer of consumers.splice(0)) await consumer.kill();
    },
  });

  beforeEach(() => {
    channel = servers.admin.newChannel();
    output = servers.admin.newChannel();
    dir = mkdtempSync(join(tmpdir(), 'nseq-fault-rsq-crash-'));
  });

  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  async function startConsumer(settings: Partial<ResequencerConsumerSettings> = {}) {
    const consumer = await ResequencerConsumerProcess.start({
      amqpUrl: AMQP_URL,
      redisUrl: SERVERS.redis.url,
      channel,
      output,
      prefix: servers.prefix,
      dir,
      leaseMs: LEASE_MS,
      sweepIntervalMs: 100,
      callHandler: true,
      ...settings,
    });
    consumers.push(consumer);
    return consumer;
  }

  /** Two consumers started at once (their start-up is most of a test's time). */
  const startTwo = (settings: Partial<ResequencerConsumerSettings>) =>
    Promise.all([startConsumer(settings), startConsumer(settings)]);

  /** Waits for one of `both` to hang on its BLOCK_ON event: that one is to be killed. */
  async function hungAndOther(both: ResequencerConsumerProcess[]) {
    await both[0].waitFor((events) => events.some((e) => e.event === 'blocked'), 'a hung handler');
    const blocked = both[0].events().find((e) => e.event === 'blocked')!;
    const killed = both.find((consumer) => consumer.pid === blocked.pid)!;
    return { killed, survivor: both.find((consumer) => consumer !== killed)! };
  }

  const handledOf = (events: ResequencerConsumerEvent[], key: string) =>
    events.filter((e) => e.event === 'handled' && e.key === key);

  interface Crash {
    readonly killed: ResequencerConsumerProcess;
    readonly survivor: ResequencerConsumerProcess;
    readonly killedAt: number;
    readonly reader: QueueCollector;
  }

  /**
   * Two consumers (each hangs on K:3 if it is the first to deliver it) take keys K (1-5) and
   * L (1-3); the one that hangs is killed; resolves once the survivor delivered K:5.
   */
  async function crashMidDelivery(drainBatch?: number): Promise<Crash> {
    const both = await startTwo({ drainBatch, blockOn: 'K:3' });
    for (const [key, seq] of EVENTS)
      await publishKeyedEvent(servers.producer, channel, { key, seq });
    const { killed, survivor } = await hungAndOther(both);
    const reader = new QueueCollector(servers.admin, output);
    // K:3 went out before the handler hung on it; key L is not held back by K's stuck drain.
    await reader.atLeast(6, 'K:1-3 and L:1-3 on the output');
    expect(Object.fromEntries(reader.seqsByKey())).toEqual({ K: [1, 2, 3], L: [1, 2, 3] });

    await killed.kill();
    const killedAt = Date.now();
    await survivor.waitFor(
      (events) => handledOf(events, 'K').some((e) => e.seq === 5),
      'the survivor delivering K:5',
    );
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the input drained',
    );
    await reader.collect();
    return { killed, survivor, killedAt, reader };
  }

  /** What is left once the survivor is done: every key delivered to its end, nothing waiting. */
  async function expectNothingLost({ reader }: Crash): Promise<void> {
    expect(reader.seqsByKey().get('L')).toEqual([1, 2, 3]);
    for (const message of reader.messages) {
      expect(message.body.toString()).toBe(defaultBodyOf(message));
    }
    const store = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
    for (const [key, next] of [
      ['K', 6],
      ['L', 4],
    ] as const) {
      expect(await store.inspect({ scope: channel, key }, 1)).toEqual({
        next,
        buffered: [],
        handOff: 0,
      });
    }
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  }

  it('with drainBatch 1, delivers the in-flight event again as an immediate repeat once the lease lapses, then the rest in order', async () => {
    // Every delivered event is settled before the next goes out, so at the kill the only event
    // delivered and not settled is the one in flight: the head of the hand-off list, which the
    // next holder delivers first. Any other duplicate, gap or reordering would be a bug.
    const crash = await crashMidDelivery(1);
    const { killed, survivor, killedAt, reader } = crash;

    expect(reader.seqsByKey().get('K')).toEqual([1, 2, 3, 3, 4, 5]);
    const handledK = handledOf(survivor.events(), 'K');
    expect(handledK.map((e) => e.seq)).toEqual([1, 2, 3, 3, 4, 5]);
    expect(handledK[2].pid).toBe(killed.pid);
    const takenOver = handledK.slice(3);
    expect(takenOver.every((e) => e.pid === survivor.pid)).toBe(true);
    // Not before the dead holder's lease lapsed: it was renewed every LEASE_MS / 3 until the
    // kill, so it ran at least 2/3 of LEASE_MS beyond it (the survivor was trying all along).
    expect(takenOver[0].at - killedAt).toBeGreaterThanOrEqual((LEASE_MS * 2) / 3 - 100);
    expect(handledOf(survivor.events(), 'L').map((e) => e.seq)).toEqual([1, 2, 3]);
    await expectNothingLost(crash);
  });

  it('with the default drainBatch, delivers the unsettled part of the claimed batch again: one contiguous, in-order run', async () => {
    // A drainer settles a claimed batch once all of it went out, so at the kill every event of
    // the batch up to the in-flight one may be out and unsettled: the survivor starts over from
    // the first of them (j <= 3). Duplicates are thus a repeated run, never a reordering.
    const crash = await crashMidDelivery();
    const outputK = crash.reader.seqsByKey().get('K')!;

    expect(outputK.slice(0, 3)).toEqual([1, 2, 3]);
    const resumedAt = outputK[3];
    expect(resumedAt).toBeGreaterThanOrEqual(1);
    expect(resumedAt).toBeLessThanOrEqual(3);
    expect(outputK.slice(3)).toEqual(range(resumedAt, 5));
    expect(
      handledOf(crash.survivor.events(), 'K')
        .filter((e) => e.pid === crash.survivor.pid && e.at >= crash.killedAt)
        .map((e) => e.seq),
    ).toEqual(range(resumedAt, 5));
    await expectNothingLost(crash);
  });
  it("finishes a delivery the gap sweeper started and a kill interrupted, from the other instance's sweeper (no input message is left to redeliver)", async () => {
    // 'skip' releases K:2-3 from a sweep, not from an input message: both inputs were acked when
    // they were buffered. Only the survivor's sweep of stalled hand-off lists can find the key.
    const both = await startTwo({
      drainBatch: 1,
      blockOn: 'K:2',
      gapPolicy: 'skip',
      gapTimeoutMs: 300,
    });
    for (const seq of [2, 3]) await publishKeyedEvent(servers.producer, channel, { key: 'K', seq });
    const { killed, survivor } = await hungAndOther(both);
    expect(await servers.admin.totalCount(channel)).toEqual({ ready: 0, unacked: 0 });
    await killed.kill();
    const killedAt = Date.now();

    await survivor.waitFor(
      (events) => handledOf(events, 'K').some((e) => e.seq === 3),
      'the survivor delivering K:3',
    );
    const reader = new QueueCollector(servers.admin, output);
    await reader.atLeast(3, 'K:2, K:2 again and K:3');
    expect(reader.seqsByKey().get('K')).toEqual([2, 2, 3]);
    const takenOver = handledOf(survivor.events(), 'K').filter((e) => e.pid === survivor.pid);
    expect(takenOver.map((e) => e.seq)).toEqual([2, 3]);
    expect(takenOver[0].at - killedAt).toBeGreaterThanOrEqual((LEASE_MS * 2) / 3 - 100);
    // The skip record was settled before K:2 went out: it is not repeated.
    const dlq = await new QueueCollector(servers.admin, `${channel}.dlq`).atLeast(
      1,
      'the skip record',
    );
    expect(dlq.map((record) => String(record.headers['x-death-reason']))).toEqual([
      expect.stringMatching(/^resequencer-gap-skipped: key K: gave up waiting for 1;/),
    ]);
    const store = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
    expect(await store.inspect({ scope: channel, key: 'K' }, 1)).toEqual({
      next: 4,
      buffered: [],
      handOff: 0,
    });
  });
});

function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}
