import fc from 'fast-check';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { MessageTooLargeError } from '../core/errors/message-too-large.error';
import { PublishRejectedError } from '../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../core/errors/publish-timeout.error';
import type { ResolvedPublishPolicy } from '../options/resolved-options';
import { FaultInjectingTransport } from '../../test/support/sequence-test-app';
import { delay } from '../core/async';
import { isUnsendable } from '../ports/transport.port';
import { PartitionCountMismatchError } from '../core/errors/partition-count-mismatch.error';
import { inMemoryPartitionQueue } from '../adapters/transports/in-memory/in-memory.transport';
import { backoff, publishWithRetry } from './publish-with-retry';

/** A publish policy: `confirmTimeoutMs` and the retry fields, flat, over these defaults. */
const policy = (
  overrides: {
    confirmTimeoutMs?: number;
    attempts?: number;
    baseDelayMs?: number;
    maxDelayMs?: number;
  } = {},
): ResolvedPublishPolicy => {
  const { confirmTimeoutMs = 1_000, attempts = 5, baseDelayMs = 0, maxDelayMs = 1_000 } = overrides;
  return { confirmTimeoutMs, inFlight: 1, retry: { attempts, baseDelayMs, maxDelayMs } };
};

describe('backoff', () => {
  afterEach(() => jest.restoreAllMocks());

  it('waits between half and all of baseDelayMs before the first retry', () => {
    jest.spyOn(Math, 'random').mockReturnValue(0);
    expect(backoff(1, 100, 5_000)).toBe(50);
    jest.spyOn(Math, 'random').mockReturnValue(0.999_999);
    expect(backoff(1, 100, 5_000)).toBeCloseTo(100, 3);
  });

  it('doubles the ceiling with each attempt', () => {
    jest.spyOn(Math, 'random').mockReturnValue(0.999_999);
    const ceilings = [1, 2, 3, 4, 5].map((attempt) => Math.round(backoff(attempt, 100, 100_000)));
    expect(ceilings).toEqual([100, 200, 400, 800, 1_600]);
  });

  it('never exceeds maxDelayMs, however many attempts', () => {
    jest.spyOn(Math, 'random').mockReturnValue(0.999_999);
    expect(backoff(7, 100, 5_000)).toBeLessThanOrEqual(5_000);
    expect(backoff(7, 100, 5_000)).toBeGreaterThan(4_999);
    expect(backoff(60, 100, 5_000)).toBeLessThanOrEqual(5_000);
  });

  it('stays within [ceiling / 2, ceiling] where ceiling = min(maxDelayMs, baseDelayMs × 2^(attempt-1))', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 40 }),
        fc.integer({ min: 0, max: 10_000 }),
        fc.integer({ min: 0, max: 60_000 }),
        (attempt, baseDelayMs, maxDelayMs) => {
          const ceiling = Math.min(maxDelayMs, baseDelayMs * 2 ** (attempt - 1));
          const wait = backoff(attempt, baseDelayMs, maxDelayMs);
          expect(wait).toBeGreaterThanOrEqual(ceiling / 2);
          expect(wait).toBeLessThanOrEqual(ceiling);
        },
      ),
    );
  });

  it('spreads its waits across the jitter range rather than repeating one value', () => {
    const waits = Array.from({ length: 1_000 }, () => backoff(3, 100, 5_000));
    // Ceiling 400: the waits fill [200, 400].
    expect(Math.min(...waits)).toBeGreaterThanOrEqual(200);
    expect(Math.max(...waits)).toBeLessThanOrEqual(400);
    expect(waits.filter((wait) => wait < 250).length).toBeGreaterThan(100);
    expect(waits.filter((wait) => wait > 350).length).toBeGreaterThan(100);
  });

  it('is zero when baseDelayMs is zero', () => {
    expect(backoff(1, 0, 5_000)).toBe(0);
    expect(backoff(10, 0, 5_000)).toBe(0);
  });

  // Regression: past attempt 1024, 2 ** (attempt - 1) is Infinity and 0 × Infinity is NaN.
  it('stays a finite number past attempt 1024 with a zero base delay', () => {
    expect(Number.isFinite(backoff(1_100, 0, 5_000))).toBe(true);
  });
});

describe('delay', () => {
  it('resolves after at least the given time', async () => {
    const started = Date.now();
    await delay(30);
    expect(Date.now() - started).toBeGreaterThanOrEqual(29);
  });
});

describe('publishWithRetry', () => {
  let inner: InMemoryTransport;
  let transport: FaultInjectingTransport;

  beforeEach(() => {
    inner = new InMemoryTransport();
    transport = new FaultInjectingTransport(inner);
  });

  afterEach(async () => {
    await transport.close();
  });

  it('publishes once and reports one attempt when the first is confirmed', async () => {
    const outcome = await publishWithRetry(transport, 'q', Buffer.from('a'), { k: 1 }, policy());

    expect(outcome).toEqual({ ok: true, attempts: 1 });
    const [message] = inner.take('q');
    expect(message.body.toString()).toBe('a');
    expect(message.headers).toEqual({ k: 1 });
  });

  it('asks the transport for a confirm within confirmTimeoutMs', async () => {
    await publishWithRetry(transport, 'q', Buffer.from('a'), {}, policy({ confirmTimeoutMs: 777 }));

    expect(transport.attempts[0].options).toEqual({ timeoutMs: 777 });
  });

  it('retries failed attempts until one is confirmed, leaving one message', async () => {
    transport.beforePublish = ({ attempt }) => {
      if (attempt <= 2) throw new Error(`nack ${attempt}`);
    };

    const outcome = await publishWithRetry(transport, 'q', Buffer.from('a'), {}, policy());

    expect(outcome).toEqual({ ok: true, attempts: 3 });
    expect(inner.depth('q')).toBe(1);
  });

  it('says a message may have been delivered when an attempt timed out waiting for its confirm', async () => {
    let attempt = 0;
    transport.beforePublish = () => {
      attempt++;
      if (attempt === 1) return new Promise<void>(() => undefined); // sent, never confirmed
      throw new Error('nack');
    };

    const outcome = await publishWithRetry(
      transport,
      'q',
      Buffer.from('a'),
      {},
      policy({ attempts: 2, confirmTimeoutMs: 20 }),
    );

    expect(outcome).toMatchObject({ ok: false, attempts: 2, maybeDelivered: true });
  });

  it('reports the last error once every attempt has failed', async () => {
    const errors: Error[] = [];
    transport.beforePublish = ({ attempt }) => {
      errors.push(new Error(`nack ${attempt}`));
      throw errors[errors.length - 1];
    };

    const outcome = await publishWithRetry(
      transport,
      'q',
      Buffer.from('a'),
      {},
      policy({ attempts: 4 }),
    );

    expect(outcome).toEqual({ ok: false, attempts: 4, error: errors[3], maybeDelivered: false });
    expect(transport.attempts).toHaveLength(4);
    expect(inner.depth('q')).toBe(0);
  });

  it('waits the backoff between attempts', async () => {
    transport.beforePublish = ({ attempt }) => {
      if (attempt <= 2) throw new Error('nack');
    };

    await publishWithRetry(
      transport,
      'q',
      Buffer.from('a'),
      {},
      policy({ baseDelayMs: 30, maxDelayMs: 30 }),
    );

    // Ceiling capped at 30 ms: each retry waits 15 to 30 ms.
    const [first, second, third] = transport.attempts;
    expect(second.at - first.at).toBeGreaterThanOrEqual(15 - 1);
    expect(third.at - second.at).toBeGreaterThanOrEqual(15 - 1);
    expect(third.at - second.at).toBeLessThan(30 + 200);
  });

  it('asks mayAttempt before a backoff, with the wait counted, and does not wait when told no', async () => {
    transport.beforePublish = () => {
      throw new Error('nack');
    };
    const asked: number[] = [];
    const started = Date.now();

    const outcome = await publishWithRetry(
      transport,
      'q',
      Buffer.from('a'),
      {},
      policy({ baseDelayMs: 60_000, maxDelayMs: 60_000, confirmTimeoutMs: 100 }),
      (longestMs) => {
        asked.push(longestMs);
        return asked.length === 1;
      },
    );

    expect(outcome).toMatchObject({ ok: false, attempts: 1 });
    // Before the first attempt its timeout; before the backoff, the wait (30–60 s) on top.
    expect(asked[0]).toBe(100);
    expect(asked[1]).toBeGreaterThanOrEqual(30_000 + 100);
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('gives up on a publish that is never confirmed after confirmTimeoutMs', async () => {
    transport.beforePublish = () => new Promise<void>(() => undefined);

    const started = Date.now();
    const outcome = await publishWithRetry(
      transport,
      'q',
      Buffer.from('a'),
      {},
      policy({ confirmTimeoutMs: 40, attempts: 2 }),
    );

    expect(outcome.ok).toBe(false);
    expect(outcome.attempts).toBe(2);
    const error = (outcome as { error: unknown }).error;
    expect(error).toBeInstanceOf(PublishTimeoutError);
    expect(error).toMatchObject({ channel: 'q', timeoutMs: 40 });
    expect(Date.now() - started).toBeGreaterThanOrEqual(2 * 40 - 2);
  });

  it('does not retry a message too large for the transport', async () => {
    const small = new FaultInjectingTransport(new InMemoryTransport({ maxMessageBytes: 100 }));

    const outcome = await publishWithRetry(small, 'q', Buffer.alloc(200), {}, policy());

    expect(outcome.ok).toBe(false);
    expect(outcome.attempts).toBe(1);
    expect((outcome as { error: unknown }).error).toBeInstanceOf(MessageTooLargeError);
    expect(small.attempts).toHaveLength(1);
  });

  it('does not retry a publish the transport refused for good before sending', async () => {
    const refusal = Object.assign(new Error('the stream refuses this publish'), {
      finalRefusal: true as const,
    });
    transport.beforePublish = () => {
      throw refusal;
    };

    const outcome = await publishWithRetry(transport, 'q', Buffer.from('a'), {}, policy());

    expect(outcome).toEqual({ ok: false, attempts: 1, error: refusal, maybeDelivered: false });
    expect(transport.attempts).toHaveLength(1);
    // Not a message no transport can send: its callers keep it rather than dead-letter it.
    expect(isUnsendable(refusal)).toBe(false);
  });

  it('does not retry a publish to a partitioned channel declared with another count', async () => {
    await inner.subscribe('parts', async () => ({ action: 'ack' }), { partitions: 4 });

    const outcome = await publishWithRetry(
      transport,
      'parts',
      Buffer.from('a'),
      {},
      policy(),
      undefined,
      { index: 0, count: 2 },
    );

    expect(outcome.ok).toBe(false);
    expect(outcome.attempts).toBe(1);
    expect((outcome as { error: unknown }).error).toBeInstanceOf(PartitionCountMismatchError);
    expect(inner.depth(inMemoryPartitionQueue('parts', 0))).toBe(0);
  });

  it('does not retry a reply its closed reply channel refused', async () => {
    const replies = await inner.openReplyChannel(async () => ({ action: 'ack' }));
    await replies.close();

    const outcome = await publishWithRetry(inner, replies.channel, Buffer.from('a'), {}, policy());

    expect(outcome.ok).toBe(false);
    expect(outcome.attempts).toBe(1);
    expect((outcome as { error: unknown }).error).toBeInstanceOf(PublishRejectedError);
  });
});
