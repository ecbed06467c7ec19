import { Logger } from '@nestjs/common';
import { Readable } from 'node:stream';
import { ClaimCheckPublishError, SequenceError, SequenceOptionsError } from 'nest-sequence';
import { bytes, FaultInjectingTransport } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

/**
 * Claim Check: the payload is stored before its ticket is published. When the broker never
 * confirms the ticket, `publish()` throws ClaimCheckPublishError and deletes the payload again;
 * when that delete fails too, the payload is an orphan that the sweeper deletes once
 * `orphanGraceMs` has passed, and it deletes nothing that was published.
 */
describe('claim check: publishing fails after the payload was stored', () => {
  const REFUSED = 'cc.refused';
  const ACCEPTED = 'cc.accepted';
  const PUBLISH_ATTEMPTS = 2;
  let t: ClaimCheckTestApp;
  let store: FaultInjectingPayloadStore;
  let transport: FaultInjectingTransport;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      claimCheck: {
        inlineMaxBytes: 100,
      },
      module: {
        publish: { retry: { attempts: PUBLISH_ATTEMPTS, baseDelayMs: 1, maxDelayMs: 2 } },
      },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
      wrapTransport: (inner) => (transport = new FaultInjectingTransport(inner)),
    });
    transport.beforePublish = ({ channel }) => {
      if (channel === REFUSED) throw new Error('the broker refused the message (injected)');
    };
  });
  afterEach(() => t.close());

  async function publishRefused(payload: Buffer | Readable): Promise<ClaimCheckPublishError> {
    const error: unknown = await t.claimCheck.publish(REFUSED, payload).then(
      () => undefined,
      (rejection: unknown) => rejection,
    );
    expect(error).toBeInstanceOf(ClaimCheckPublishError);
    return error as ClaimCheckPublishError;
  }

  it('throws ClaimCheckPublishError naming the payload, after the configured attempts', async () => {
    const error = await publishRefused(bytes(1_000, 1));

    expect(error).toBeInstanceOf(SequenceError);
    expect(error.code).toBe('publish-failed');
    expect(error.channel).toBe(REFUSED);
    expect(error.via).toBe('ticket');
    expect(error.attempts).toBe(PUBLISH_ATTEMPTS);
    expect(error.payload).toMatch(/^filesystem:\d{4}\/\d{2}\/\d{2}\/[0-9a-f-]{36}$/);
    expect(transport.attempts.filter((a) => a.channel === REFUSED)).toHaveLength(PUBLISH_ATTEMPTS);
    expect(t.transport.depth(REFUSED)).toBe(0);
  });

  it('deletes the stored payload again: the store is empty', async () => {
    await publishRefused(bytes(1_000, 2));
    expect(await filesUnder(t.root)).toEqual([]);
    expect(store.calls.delete).toBe(1);
  });

  it('deletes a streamed payload again too', async () => {
    await publishRefused(Readable.from([bytes(600, 3), bytes(600, 4)]));
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('an inline payload: ClaimCheckPublishError via inline, nothing stored', async () => {
    const error = await publishRefused(Buffer.from('small'));
    expect(error.via).toBe('inline');
    expect(error.payload).toBeUndefined();
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('a source stream that fails part-way: publish rejects with its error, nothing is left', async () => {
    async function* failing(): AsyncGenerator<Buffer> {
      yield bytes(600, 9);
      yield bytes(600, 10); // past the threshold: this payload is being stored
      throw new Error('the source disk failed (injected)');
    }
    await expect(t.claimCheck.publish(ACCEPTED, Readable.from(failing()))).rejects.toThrow(
      'the source disk failed (injected)',
    );
    expect(await filesUnder(t.root)).toEqual([]);
    expect(t.transport.depth(ACCEPTED)).toBe(0);
  });

  it("a store that refuses the payload: publish rejects, and the caller's stream is closed (a file handle is not leaked)", async () => {
    store.failPuts = 1;
    const source = Readable.from([bytes(600, 11), bytes(600, 12), bytes(600, 13)]);
    await expect(t.claimCheck.publish(ACCEPTED, source)).rejects.toThrow(/put, injected/);
    // Before, only the wrapper that had read its first chunks was destroyed, not the source.
    await new Promise((resolve) => setImmediate(resolve));
    expect(source.destroyed).toBe(true);
    expect(t.transport.depth(ACCEPTED)).toBe(0);
  });

  it('refuses a per-call inlineMaxBytes above what one message carries, before reading, and closes the stream', async () => {
    const source = Readable.from([bytes(600, 14)]);
    const refusal: unknown = await t.claimCheck
      .publish(ACCEPTED, source, {
        inlineMaxBytes: 64 * 1024 * 1024,
      })
      .catch((error: unknown) => error);
    // Before, it read the stream up to 64 MiB into memory, then failed to send it inline.
    expect(refusal).toBeInstanceOf(SequenceOptionsError);
    expect((refusal as SequenceOptionsError).problems).toEqual([
      expect.stringMatching(
        /^inlineMaxBytes \(67108864\) exceeds what one message of the transport carries/,
      ),
    ]);
    expect(source.destroyed).toBe(true);
    expect(await filesUnder(t.root)).toEqual([]);
  });

  describe('when the delete fails too', () => {
    it('the payload is left as an orphan, and the sweeper deletes it after orphanGraceMs', async () => {
      const published = await t.claimCheck.publish(ACCEPTED, bytes(1_000, 5));
      const checkedIn = await t.claimCheck.checkIn(bytes(1_000, 6), { audience: t.channel });
      store.failDeletes = 1;
      const error = await publishRefused(bytes(1_000, 7));
      const orphanRef = (error.payload ?? '').replace(/^filesystem:/, '');
      const now = Date.now();
      expect(await t.store.head(orphanRef)).toMatchObject({ published: false });

      // Within the grace period nothing goes: its ticket might still be confirmed.
      expect(await t.sweeper.sweep(now)).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.store.head(orphanRef)).toBeDefined();

      const report = await t.sweeper.sweep(now + t.options.claimCheck.orphanGraceMs + 1);
      expect(report).toEqual({ expired: 0, orphaned: 1 });
      expect(await t.store.head(orphanRef)).toBeUndefined();
      expect(await t.store.head(published.ticket?.ref ?? '')).toMatchObject({ published: true });
      expect(await t.store.head(checkedIn.ref)).toMatchObject({ published: true });
      expect(
        await claimMetric(t, 'payloads_deleted_total', { store: 'filesystem', reason: 'orphaned' }),
      ).toBe(1);
    });

    it('a sweep whose delete fails keeps the orphan for the next sweep', async () => {
      store.failDeletes = 1;
      const error = await publishRefused(bytes(1_000, 8));
      const orphanRef = (error.payload ?? '').replace(/^filesystem:/, '');
      const later = Date.now() + t.options.claimCheck.orphanGraceMs + 1;

      store.failDeletes = 1;
      expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.store.head(orphanRef)).toBeDefined();
      expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 1 });
      expect(await filesUnder(t.root)).toEqual([]);
    });
  });
});

describe('claim check: a consumer faster than the publish confirm', () => {
  let t: ClaimCheckTestApp;
  afterEach(async () => {
    jest.restoreAllMocks();
    await t.close();
  });

  it('logs no error when the consumer deleted the payload before it was marked published', async () => {
    const errors: string[] = [];
    const warnings: string[] = [];
    jest.spyOn(Logger.prototype, 'error').mockImplementation((message: unknown) => {
      errors.push(String(message));
    });
    jest.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => {
      warnings.push(String(message));
    });
    // The broker delivers the ticket before the producer has its confirm (RabbitMQ may): the
    // producer marks the payload published once its consumer is done and has deleted it. (The
    // consumer, finding it unmarked, marks it itself before its handler reads it: the call
    // right after its look at the payload.)
    let consumed!: () => void;
    const consumerDone = new Promise<void>((resolve) => (consumed = resolve));
    t = await createClaimCheckTestApp({
      claimCheck: { inlineMaxBytes: 100 },
      wrapStore: (inner) => {
        const store = new FaultInjectingPayloadStore(inner);
        const lookedAt = new Set<string>();
        const head = store.head.bind(store);
        store.head = (ref) => {
          lookedAt.add(ref);
          return head(ref);
        };
        store.markPublished = async (ref) => {
          if (!lookedAt.delete(ref)) await consumerDone;
          return inner.markPublished(ref);
        };
        return store;
      },
    });
    t.handler.onCall = async () => {
      setTimeout(consumed, 20);
    };
    const payload = bytes(5_000, 4);

    const receipt = await t.claimCheck.publish(t.channel, payload);
    await t.transport.whenIdle();

    expect(receipt.via).toBe('ticket');
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
    expect(errors).toEqual([]);
    expect(warnings).toEqual([
      expect.stringMatching(
        /was gone when its ticket's publish was confirmed: its consumers handled it already/,
      ),
    ]);
  });
});
