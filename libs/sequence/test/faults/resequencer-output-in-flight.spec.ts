import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { heldEntryBytes } from '../../src/ports/resequencer-store.port';
import { SERVERS } from '../support/servers';
import { eventually, shuffled } from '../support/sequence-test-app';
import { refuseEveryPublish } from './support/broker-policy';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import {
  createResequencerApp,
  publishKeyedEvents,
  type ResequencerApp,
} from './support/resequencer-app';
import { QueueCollector } from './support/resequencer-output';
import { AMQP_URL, type QueuedMessage } from '../support/rabbitmq.fixture';
import { ResequencerConsumerProcess } from '../support/processes/resequencer-consumer-process';

jest.setTimeout(120_000);

const GAP = { timeoutMs: 600_000, policy: 'alert' } as const;
const EVENTS_PER_KEY = 10;
/** Publishes in flight at once while loading the input (each waits for its confirm). */
const PUBLISH_CONCURRENCY = 200;
/** Keys of the connection-drop test: enough for output to be in flight when the drop lands. */
const KEYS = 500;
/** Events of the connection-drop test published before the drop; the rest only after it. */
const BEFORE_THE_DROP = 0.6;

/**
 * `outputInFlight` above 1 on the real servers: a key's publishes to `output` leave in order
 * without waiting for each confirm. What must still hold when the broker connection drops in the
 * middle, or the broker refuses the output: nothing lost, and no event on the output before an
 * earlier event of its key (an event may come again after a failure: at least once).
 */
describeOnRealServers('faults: a Resequencer with outputInFlight above 1', () => {
  let t: ResequencerApp | undefined;
  const consumers: ResequencerConsumerProcess[] = [];
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
      for (const consumer of consumers.splice(0)) await consumer.kill();
    },
  });

  /** Every event of every key is on the output, and each key's events were first seen in order. */
  function expectAllFirstSeenInOrder(messages: readonly QueuedMessage[], keys: number) {
    const firstSeen = new Map<string, number[]>();
    for (const message of messages) {
      const key = String(message.headers['x-resequence-key']);
      const seq = Number(message.headers['x-resequence-seq']);
      const seqs = firstSeen.get(key) ?? [];
      if (!seqs.includes(seq)) seqs.push(seq);
      firstSeen.set(key, seqs);
    }
    const inOrder = Array.from({ length: EVENTS_PER_KEY }, (_, i) => i + 1).join();
    expect([...firstSeen].filter(([, seqs]) => seqs.join() !== inOrder)).toEqual([]);
    expect(firstSeen.size).toBe(keys);
  }

  it('survives its connection dropped mid-run: every event of every key on the output, first seen in order', async () => {
    const channel = servers.admin.newChannel();
    const output = servers.admin.newChannel();
    t = await createResequencerApp(
      { channel, output, outputInFlight: 8, prefetch: 16, gap: GAP },
      { prefix: servers.prefix },
    );
    const events = Array.from({ length: KEYS }, (_, key) =>
      Array.from({ length: EVENTS_PER_KEY }, (__, i) => ({ key: `K${key}`, seq: i + 1 })),
    ).flat();
    const stream = shuffled(events, 41);
    const split = Math.floor(stream.length * BEFORE_THE_DROP);
    // Looked up (a rabbitmqctl call, a second or two) while the first events flow.
    const lookingUp = servers.admin.connectionPid(t.connectionName);
    lookingUp.catch(() => undefined); // awaited below: its failure is reported there
    const loading = publishKeyedEvents(
      servers.producer,
      channel,
      stream.slice(0, split),
      PUBLISH_CONCURRENCY,
    );

    // The app consumes while the input fills; its connection drops once output is flowing. The
    // rest of the input is only published after the drop, so the drop always lands mid-run.
    const reader = new QueueCollector(servers.admin, output);
    await reader.atLeast(200, 'the first events on the output', 20_000);
    const droppedPid = await lookingUp;
    await servers.admin.closeConnectionPid(droppedPid);
    await loading;
    const seenAtTheDrop = new Set((await reader.collect()).map(idOf));
    await publishKeyedEvents(servers.producer, channel, stream.slice(split), PUBLISH_CONCURRENCY);
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the input drained',
      40_000,
    );
    await eventually(
      async () => new Set((await reader.collect()).map(idOf)).size === events.length,
      'every event on the output',
      40_000,
    );

    // Keys were cut by the drop: events of theirs on the output before it, and after it.
    const publishedAfterTheDrop = new Set(stream.slice(split).map(({ key }) => key));
    const keysAcrossTheDrop = new Set(
      [...seenAtTheDrop]
        .map((id) => id.split(':')[0])
        .filter((key) => publishedAfterTheDrop.has(key)),
    );
    expect(keysAcrossTheDrop.size).toBeGreaterThan(0);
    // The app came back on a new connection.
    expect(await servers.admin.connectionPid(t.connectionName)).not.toBe(droppedPid);
    expectAllFirstSeenInOrder(reader.messages, KEYS);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  it('one of two consumer processes SIGKILLed mid-run: the other delivers the rest; every event of every key on the output, first seen in order', async () => {
    const channel = servers.admin.newChannel();
    const output = servers.admin.newChannel();
    const dir = mkdtempSync(join(tmpdir(), 'nseq-fault-rsq-window-'));
    try {
      const start = () =>
        ResequencerConsumerProcess.start({
          amqpUrl: AMQP_URL,
          redisUrl: SERVERS.redis.url,
          channel,
          output,
          prefix: servers.prefix,
          dir,
          leaseMs: 2_000,
          sweepIntervalMs: 200,
          prefetch: 32,
          outputInFlight: 8,
        });
      consumers.push(...(await Promise.all([start(), start()])));
      const keys = 1_000;
      const events = Array.from({ length: keys }, (_, key) =>
        Array.from({ length: EVENTS_PER_KEY }, (__, i) => ({ key: `K${key}`, seq: i + 1 })),
      ).flat();
      const loading = publishKeyedEvents(
        servers.producer,
        channel,
        shuffled(events, 43),
        PUBLISH_CONCURRENCY,
      );

      // Counted without reading the output, so that the kill lands while it is still filling.
      await eventually(
        // The output queue is declared by the consumers' first publish.
        async () => (await servers.admin.readyCount(output).catch(() => 0)) >= 1_000,
        'output flowing',
        20_000,
      );
      await consumers[0].kill();
      const seenAtTheKill = await servers.admin.readyCount(output);
      await loading;
      const reader = new QueueCollector(servers.admin, output);
      await eventually(
        async () => new Set((await reader.collect()).map(idOf)).size === events.length,
        'every event on the output',
        45_000,
      );

      expect(seenAtTheKill).toBeLessThan(events.length);
      expectAllFirstSeenInOrder(reader.messages, keys);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('output refused by the broker: nothing of the window counts; the key delivers in order once the broker takes it', async () => {
    const channel = servers.admin.newChannel();
    const output = servers.admin.newChannel();
    const published = new QueueCollector(servers.admin, output);
    t = await createResequencerApp(undefined, { prefix: servers.prefix });
    const resequencer = t.service.create({ channel, output, outputInFlight: 4, gap: GAP });
    const event = (seq: number) => ({
      body: Buffer.from(`K#${seq}`),
      headers: { 'x-resequence-key': 'K', 'x-resequence-seq': seq },
    });

    const allow = await refuseEveryPublish(output);
    let allowed = false;
    try {
      for (const seq of [2, 3, 4]) {
        await expect(resequencer.receive(event(seq))).resolves.toEqual({ action: 'ack' });
      }
      // 1 releases 1..4: the window of four is refused, then 1 alone with its retries.
      await expect(resequencer.receive(event(1))).resolves.toEqual({
        action: 'requeue',
        delayMs: 50,
        reason: 'key K: output unreachable',
      });
      await expect(resequencer.inspect('K')).resolves.toEqual({
        next: 5,
        buffered: [],
        handOff: 4,
        heldBytes: [1, 2, 3, 4].reduce(
          (sum, seq) => sum + heldEntryBytes({ seq, ...event(seq) }),
          0,
        ),
      });
      expect(await published.collect()).toEqual([]);
      await allow();
      allowed = true;
    } finally {
      if (!allowed) await allow();
    }

    // The requeued input comes back: late now, its events still pending; it drains them.
    await expect(resequencer.receive(event(1))).resolves.toEqual({ action: 'ack' });
    await published.atLeast(4, 'the four events on the output');
    expect((await published.collect()).map((message) => message.body.toString())).toEqual([
      'K#1',
      'K#2',
      'K#3',
      'K#4',
    ]);
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 5,
      buffered: [],
      handOff: 0,
    });
  });
});

function idOf(message: { headers: Record<string, unknown> }): string {
  return `${String(message.headers['x-resequence-key'])}:${String(message.headers['x-resequence-seq'])}`;
}
