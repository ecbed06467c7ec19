import { randomUUID } from 'node:crypto';
import type { HeaderMap } from 'nest-sequence/wire';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { ResequenceHeader } from 'nest-sequence/wire';
import { AggregatorService, ResequencerService } from 'nest-sequence';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describeOnRealServers } from '../faults/support/real-servers';
import {
  bytes,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
} from '../support/sequence-test-app';
import {
  BUDGETS,
  createAdversarialApp,
  INBOX_EVENT_TYPE,
  KEYS_PER_SEQUENCE,
  KiB,
  sampleRedis,
  SLACK,
  type AdversarialApp,
  type ChannelKind,
  type DeadLetter,
  type Target,
} from './adversarial-app';
import { CATALOGUE, type CaseContext, type HostileCase } from './catalogue';

jest.setTimeout(60_000);

/** A time past every deadline the app can have set: a sweep as of then expires what is open. */
const LATER_MS = 3_600_000;

/** Process memory the app may hold for its budgets: sequence buffers and resequencer buffers. */
const MEMORY_BUDGET = BUDGETS.maxBufferedBytes + BUDGETS.maxBufferedBytesTotal;

/**
 * What Redis may hold for the budgets: sequence bodies and overheads, the resequencer's buffers
 * in base64, a parked payload or two.
 */
const REDIS_BUDGET_BYTES =
  BUDGETS.maxBufferedBytes + Math.ceil((BUDGETS.maxBufferedBytesTotal * 4) / 3) + 64 * KiB;

/** Open sequences the byte budget can hold at the least charge (1 KiB + 128 bytes each). */
const MAX_SEQUENCES_IN_BUDGET = Math.floor(BUDGETS.maxBufferedBytes / (KiB + 128));
const REDIS_BUDGET_KEYS = KEYS_PER_SEQUENCE * MAX_SEQUENCES_IN_BUDGET;

/** Keys that hold buffered data: none may stay, for any case, after a sweep. */
const BUFFER_KEY = /:(meta|crc|body|buffer|handoff)$|\{payload:/;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

/** Heap plus ArrayBuffer memory (Buffers) still referenced, after a full collection. */
function retainedBytes(): number {
  gc();
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  return heapUsed + arrayBuffers;
}

/**
 * Heap plus ArrayBuffer memory the process retains now, without a collection when what it holds,
 * garbage included, is within `bound` (retained memory is at most that); else after one: how much
 * garbage is about depends on when V8 last collected, which in a long test process (every spec
 * runs in one) is not the case's doing.
 */
function retainedWithin(bound: number): number {
  const { heapUsed, arrayBuffers } = process.memoryUsage();
  return heapUsed + arrayBuffers <= bound ? heapUsed + arrayBuffers : retainedBytes();
}

/** The process's retained memory when the app was up, and after the case before this one. */
interface MemoryMarks {
  start: number;
  previous: number;
}

function codeOf(deadLetter: DeadLetter): string {
  const reason = deadLetter.headers['x-death-reason'];
  return String(Buffer.isBuffer(reason) ? reason.toString() : reason).split(':')[0];
}

/** What each handler has received so far. */
function received(app: AdversarialApp) {
  return {
    reassemble: app.reassembled.calls,
    stream: app.streamed.fragments.length,
    streamLast: app.streamed.fragments.filter((fragment) => fragment.last).length,
    claim: app.claimed.payloads.length,
    resequenced: app.ordered.events.length,
    inbox: app.inboxed.events.length,
  };
}

/**
 * Waits until a delivered sequence is finished in the store, so that a sweep as of an hour later
 * cannot find it open: its handler returns before the store records the completion.
 */
async function finished(app: AdversarialApp, channel: string, sequenceId: string): Promise<void> {
  await eventually(
    async () =>
      !(await app.sequenceStore.listExpired(Date.now() + LATER_MS, 10_000)).some(
        (ref) => ref.scope === channel && ref.sequenceId === sequenceId,
      ),
    `sequence ${sequenceId} finished`,
    20_000,
  );
}

/** Sends a valid message to `kind`'s channel and waits for its handler to receive it whole. */
async function deliverValid(app: AdversarialApp, kind: ChannelKind, tag: string): Promise<void> {
  const channel = app.channels[kind];
  const id = `ok-${tag}`;
  const payload = bytes(5 * KiB, tag.length + 1);
  switch (kind) {
    case 'reassemble':
      await publishAll(app.producer, channel, makeFragments(id, payload, 2 * KiB));
      await eventually(
        () => app.reassembled.of(id).some((delivery) => delivery.bytes.equals(payload)),
        `${id} reassembled`,
        20_000,
      );
      await finished(app, channel, id);
      return;
    case 'stream':
      await publishAll(app.producer, channel, makeFragments(id, payload, 2 * KiB));
      await eventually(
        () =>
          app.streamed.fragments.some((f) => f.sequenceId === id && f.last && f.verified === true),
        `${id} streamed to its verified last fragment`,
        20_000,
      );
      return;
    case 'claim': {
      // Past inlineMaxBytes and within sequenceMaxBytes: a Message Sequence on the claim channel.
      const large = bytes(40 * KiB, tag.length + 2);
      const { sequenceId } = await app.claimCheck.publish(channel, large, { mode: 'auto' });
      await eventually(
        () => app.claimed.payloads.some((p) => p.via === 'sequence' && p.bytes.equals(large)),
        `a sequence claimed on ${channel}`,
        20_000,
      );
      await finished(app, channel, sequenceId!);
      return;
    }
    case 'resequenced':
      await app.producer.publish(channel, payload, {
        [ResequenceHeader.key]: id,
        [ResequenceHeader.seq]: 1,
      });
      await eventually(
        () => app.ordered.events.some((event) => event.key === id),
        `${id} resequenced`,
        20_000,
      );
      return;
    case 'inbox': {
      const messageId = randomUUID();
      const body = {
        id: messageId,
        type: INBOX_EVENT_TYPE,
        aggregateType: 'Adversary',
        aggregateId: 'a-1',
        payload: { ok: tag },
        occurredAt: new Date().toISOString(),
      };
      await app.producer.publish(channel, Buffer.from(JSON.stringify(body)), {
        [MESSAGE_ID_HEADER]: messageId,
        [MESSAGE_KIND_HEADER]: 'event',
        [MESSAGE_TYPE_HEADER]: INBOX_EVENT_TYPE,
      });
      await eventually(
        () => app.inboxed.events.some((event) => event.id === messageId),
        `inbox event ${messageId} handled`,
        20_000,
      );
      return;
    }
  }
}

/** The budgets, held during a case: the store's own account, and Redis's. */
async function expectWithinBudgets(app: AdversarialApp): Promise<void> {
  const stats = await app.sequenceStore.stats(Date.now());
  expect(stats.bufferedBytes + (stats.reservedBytes ?? 0)).toBeLessThanOrEqual(
    BUDGETS.maxBufferedBytes,
  );
  if (app.redis) {
    const sample = await sampleRedis(app.redis.client, app.redis.prefix);
    expect(sample.keys.length).toBeLessThanOrEqual(REDIS_BUDGET_KEYS + SLACK.redisKeys);
    expect(sample.bytes).toBeLessThanOrEqual(REDIS_BUDGET_BYTES + SLACK.redisBytes);
  }
}

/** Keys under the prefix that name one of the case's ids. */
async function keysNaming(app: AdversarialApp, idStem: string): Promise<string[]> {
  if (!app.redis) return [];
  const { keys } = await sampleRedis(app.redis.client, app.redis.prefix);
  return keys.filter((key) => key.includes(`:${idStem}`));
}

async function runCase(
  app: AdversarialApp,
  hostile: HostileCase,
  index: number,
  memory: MemoryMarks,
): Promise<void> {
  const channel = app.channels[hostile.channel];
  const idStem = `adv-${index}-`;
  const cleanups: (() => Promise<unknown>)[] = [];
  const context: CaseContext = {
    app,
    id: (tag = 'x') => `${idStem}${tag}`,
    onCleanup: (cleanup) => void cleanups.push(cleanup),
  };
  const before = received(app);
  const backpressureMetric = () =>
    metricValue(app.metrics.registry, 'nest_sequence_backpressure_total', { channel });
  const backpressuredBefore = await backpressureMetric();

  const dead: DeadLetter[] = [];
  const collect = async () => {
    dead.push(...(await app.takeDeadLetters(channel)));
    return dead.length;
  };
  try {
    for (const { body, headers } of await hostile.messages(context)) {
      await app.producer.publish(channel, body, headers as HeaderMap);
    }
    if (hostile.backpressure) {
      await eventually(
        async () => (await backpressureMetric()) > backpressuredBefore,
        'back-pressure at the budget',
        20_000,
      );
    } else {
      await eventually(
        async () =>
          (await collect()) >= hostile.deadLetters.length && (await app.pending(channel)) === 0,
        `${hostile.deadLetters.length} dead letter(s)`,
        20_000,
      );
    }

    // At its peak: within the budgets, in the store, in Redis and in this process.
    await expectWithinBudgets(app);
    const bound = memory.previous + MEMORY_BUDGET + SLACK.memoryBytes;
    expect(retainedWithin(bound) - memory.previous).toBeLessThanOrEqual(
      MEMORY_BUDGET + SLACK.memoryBytes,
    );
    if (hostile.storesNothing) expect(await keysNaming(app, idStem)).toEqual([]);

    const expected = [...hostile.deadLetters, ...(hostile.afterSweep ?? [])];
    if (hostile.backpressure && hostile.channel === 'reassemble') {
      // Another channel still completes while this one's share is full.
      await deliverValid(app, 'claim', `${index}-during`);
    }
    await eventually(
      async () => {
        await app.sweep(Date.now() + LATER_MS);
        return (await collect()) >= expected.length;
      },
      `${expected.length} dead letter(s) after sweeping`,
      30_000,
    );
    await eventually(async () => (await app.pending(channel)) === 0, `${channel} drained`, 20_000);
    await collect();
    expect(dead.map(codeOf).sort()).toEqual([...expected].sort());

    // Nothing of it reached a handler (stream mode: never its last fragment).
    const after = received(app);
    if (hostile.partialStreamAllowed) {
      expect(after.streamLast).toBe(before.streamLast);
      expect({ ...after, stream: 0 }).toEqual({ ...before, stream: 0 });
    } else {
      expect(after).toEqual({
        ...before,
        // The claim channel's delivery made during a back-pressure case.
        claim: before.claim + (hostile.backpressure && hostile.channel === 'reassemble' ? 1 : 0),
      });
    }

    // Still alive: a valid message on the same channel reaches its handler.
    await deliverValid(app, hostile.channel, `${index}`);

    // After a sweep, nothing of the case is buffered anywhere.
    await app.sweep(Date.now() + LATER_MS);
    expect(await app.sequenceStore.stats(Date.now())).toMatchObject({ openSequences: 0 });
    if (app.redis) {
      const left = await keysNaming(app, idStem);
      expect(left.filter((key) => BUFFER_KEY.test(key))).toEqual([]);
      if (hostile.storesNothing) expect(left).toEqual([]);
      const { keys } = await sampleRedis(app.redis.client, app.redis.prefix);
      expect(keys.filter((key) => BUFFER_KEY.test(key))).toEqual([]);
    }
    // Nothing accumulates from case to case either.
    memory.previous = retainedBytes();
    expect(memory.previous - memory.start).toBeLessThanOrEqual(MEMORY_BUDGET + SLACK.memoryBytes);
  } finally {
    for (const cleanup of cleanups) await cleanup().catch(() => undefined);
  }
}

function describeCatalogue(target: Target): void {
  let app: AdversarialApp;
  const memory: MemoryMarks = { start: 0, previous: 0 };
  beforeAll(async () => {
    app = await createAdversarialApp(target);
    memory.start = memory.previous = retainedBytes();
  });
  afterAll(async () => {
    await app?.close();
  });

  it(`holds at least 40 hostile inputs, named uniquely`, () => {
    expect(CATALOGUE.length).toBeGreaterThanOrEqual(40);
    expect(new Set(CATALOGUE.map((hostile) => hostile.name)).size).toBe(CATALOGUE.length);
  });

  CATALOGUE.forEach((hostile, index) => {
    it(`${hostile.name}: ${
      [...hostile.deadLetters, ...(hostile.afterSweep ?? [])]
        .filter((code, i, all) => all.indexOf(code) === i)
        .join(', ') || 'back-pressure'
    }`, async () => {
      await runCase(app, hostile, index, memory);
    });
  });

  if (target === 'embedded') {
    // Transports hand over Buffers; a subscriber of the user's own may hand over anything.
    it('a body that is not bytes, from a subscriber of your own, is refused with its reason', async () => {
      const aggregator = app.app.get(AggregatorService);
      const consumer = aggregator.createConsumer('adv.own-subscriber', () => undefined);
      const resequencer = app.app
        .get(ResequencerService)
        .create(
          { channel: 'adv.own-resequencer', gap: { timeoutMs: 60_000, policy: 'skip' } },
          () => undefined,
        );
      const fragment = makeFragments('adv-own-1', bytes(100, 1), 100)[0];
      for (const body of ['text', { type: 'Buffer', data: [1] }, [1, 2], null, 42]) {
        expect(
          await aggregator.receive(
            {
              channel: 'adv.own-subscriber',
              body: body as unknown as Buffer,
              headers: fragment.headers,
              redelivered: false,
            },
            consumer,
          ),
        ).toEqual({ action: 'dead-letter', reason: expect.stringMatching(/^malformed-header: /) });
        expect(
          await resequencer.receive({
            body: body as unknown as Buffer,
            headers: { [ResequenceHeader.key]: 'k', [ResequenceHeader.seq]: 1 },
          }),
        ).toEqual({
          action: 'dead-letter',
          reason: expect.stringMatching(/^invalid-resequence-event: /),
        });
      }
      expect(await app.sequenceStore.stats(Date.now())).toMatchObject({ openSequences: 0 });
    });
  }

  if (target === 'rabbitmq-redis') {
    it('leaves in Redis only markers that expire', async () => {
      await expectOnlyExpiringMarkers(app);
    });
  }
}

/**
 * What the catalogue may leave in Redis once swept: markers of finished sequences (gone after
 * `retentionMs` plus the key margin), each resequencer key's position (`:state`, kept for the
 * store's retention) and the stores' indexes; every one of them with a TTL, and no buffer.
 */
async function expectOnlyExpiringMarkers(app: AdversarialApp): Promise<void> {
  const { client, prefix } = app.redis!;
  await app.sweep(Date.now() + LATER_MS);
  const { keys } = await sampleRedis(client, prefix);
  const pipeline = client.pipeline();
  for (const key of keys) pipeline.pttl(key);
  const ttls = ((await pipeline.exec()) ?? []).map(([, ttl]) => Number(ttl));
  const lasting = keys.filter((_key, i) => ttls[i] < 0);
  expect(keys.filter((key) => BUFFER_KEY.test(key))).toEqual([]);
  expect(lasting).toEqual([]);
}

describe('adversarial catalogue on the embedded defaults', () => {
  describeCatalogue('embedded');
});

describeOnRealServers('adversarial catalogue', () => {
  describeCatalogue('rabbitmq-redis');
});
