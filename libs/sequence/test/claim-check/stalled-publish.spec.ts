import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { Readable } from 'node:stream';
import { ClaimCheckPublishError, SplitterService } from 'nest-sequence';
import { PayloadStoreTimeoutError } from 'nest-sequence/ports';
import { RedisPayloadStore } from 'nest-sequence/redis';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { keysUnder, useRedis } from '../support/redis.fixture';
import { bytes, eventually, FaultInjectingTransport } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import { recordEvents } from '../events/event-recorder';
import {
  createClaimCheckTestApp,
  filesUnder,
  type ClaimCheckTestApp,
  type ClaimCheckTestAppOptions,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

const READ_TIMEOUT_MS = 300;
const WRITE_TIMEOUT_MS = 300;
/** A channel no handler consumes: its tickets stay queued, their payloads in the store. */
const UNCONSUMED = 'cc.unconsumed';

/** `promise`'s outcome, or 'pending' if it has not settled within `ms` (a hung call never does). */
async function outcomeWithin<T>(
  promise: Promise<T>,
  ms = 5_000,
): Promise<{ value: T } | { error: unknown } | 'pending'> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'pending'>((resolve) => (timer = setTimeout(resolve, ms, 'pending')));
  const outcome = await Promise.race([
    promise.then(
      (value) => ({ value }),
      (error: unknown) => ({ error }),
    ),
    late,
  ]);
  clearTimeout(timer);
  return outcome;
}

/** `outcome` is a publish's receipt for a ticket, and the store holds the whole of `payload`. */
async function expectStoredWhole(
  app: ClaimCheckTestApp,
  outcome: Awaited<ReturnType<typeof outcomeWithin>>,
  payload: Buffer,
): Promise<void> {
  expect(outcome).toEqual({ value: expect.objectContaining({ via: 'ticket' }) });
  const { ticket } = (outcome as { value: { ticket: { ref: string } } }).value;
  expect((await app.store.head(ticket.ref))?.bytes).toBe(payload.length);
}

/** A stream of `payload` in `pieces` chunks, one every `gapMs`: a source slower than the store. */
function slowSource(payload: Buffer, pieces: number, gapMs: number): Readable {
  const size = Math.ceil(payload.length / pieces);
  return Readable.from(
    (async function* () {
      for (let offset = 0; offset < payload.length; offset += size) {
        await new Promise((resolve) => setTimeout(resolve, gapMs));
        yield payload.subarray(offset, offset + size);
      }
    })(),
  );
}

/**
 * Claim Check: the payload store calls a publish makes after the upload — the mark of the payload
 * once its ticket is confirmed, the delete of one whose ticket failed, the mark of a slow upload
 * before its ticket goes out — and the delete of a parked fragment body its consumer took, must
 * not hang their caller for ever when the store stops answering, nor may `release()` by hand.
 * Each is given up on after `claimCheck.readTimeoutMs`.
 */
describe("claim check: a store that never answers a publish, a release or a parked body's delete", () => {
  let t: ClaimCheckTestApp | undefined;
  let store: FaultInjectingPayloadStore;
  let transport: FaultInjectingTransport;
  const warnings: string[] = [];
  const errors: string[] = [];

  async function boot(options: Partial<ClaimCheckTestAppOptions> = {}): Promise<ClaimCheckTestApp> {
    t = await createClaimCheckTestApp({
      ...options,
      claimCheck: {
        readTimeoutMs: READ_TIMEOUT_MS,
        writeTimeoutMs: WRITE_TIMEOUT_MS,
        inlineMaxBytes: 100,
        ...options.claimCheck,
      },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
      wrapTransport: (inner) => (transport = new FaultInjectingTransport(inner)),
    });
    return t;
  }
  beforeEach(() => {
    warnings.length = errors.length = 0;
    jest.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => {
      warnings.push(String(message));
    });
    jest.spyOn(Logger.prototype, 'error').mockImplementation((message: unknown) => {
      errors.push(String(message));
    });
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    await t?.close();
    t = undefined;
  });

  it('a mark after the confirm that never answers: publish resolves after readTimeoutMs, and the payload is marked in the background', async () => {
    const app = await boot();
    store.hangMarks = 1;
    const startedAt = Date.now();

    const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, bytes(1_000, 1)));

    expect(outcome).toEqual({ value: expect.objectContaining({ via: 'ticket' }) });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(READ_TIMEOUT_MS);
    expect(app.transport.depth(UNCONSUMED)).toBe(1);
    const { ref } = (outcome as { value: { ticket: { ref: string } } }).value.ticket;
    expect(warnings).toContainEqual(expect.stringMatching(/did not answer markPublished/));
    // Tried again after a second: published, the sweeper leaves it to its ticket.
    await eventually(
      async () => (await app.store.head(ref))?.published === true,
      'the payload marked published',
    );
    const later = Date.now() + app.options.claimCheck.orphanGraceMs + 1;
    expect(await app.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
  });

  it('a store that never answers the mark again: the publish resolves, and the payload left unmarked is logged as an error', async () => {
    // orphanGraceMs above twice the publish budget: 1 × (100 + 10) ms.
    const app = await boot({
      claimCheck: { orphanGraceMs: 300 },
      module: {
        publish: { confirmTimeoutMs: 100, retry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 10 } },
      },
    });
    store.hangMarks = 1_000;

    const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, bytes(1_000, 2)));

    expect(outcome).toEqual({ value: expect.objectContaining({ via: 'ticket' }) });
    await eventually(
      () => errors.some((error) => /could not be marked published/.test(error)),
      'the unmarked payload reported',
    );
  });

  it('a delete after a failed publish that never answers: ClaimCheckPublishError after readTimeoutMs, the payload left to the orphan sweeper', async () => {
    const app = await boot();
    transport.beforePublish = ({ channel }) => {
      if (channel === UNCONSUMED) throw new Error('the broker refused the message (injected)');
    };
    store.hangDeletes = 1;

    const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, bytes(1_000, 3)));

    expect(outcome).toEqual({ error: expect.any(ClaimCheckPublishError) });
    expect(warnings).toContainEqual(expect.stringMatching(/did not answer delete/));
    const later = Date.now() + app.options.claimCheck.orphanGraceMs + 1;
    expect(await app.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 1 });
    expect(await filesUnder(app.root)).toEqual([]);
  });

  it('the mark of a slow upload before its ticket that never answers: PayloadStoreTimeoutError, nothing published, the payload deleted', async () => {
    const app = await boot({
      claimCheck: { orphanGraceMs: 300 },
      module: {
        publish: { confirmTimeoutMs: 100, retry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 10 } },
      },
    });
    store.hangMarks = 1;

    const outcome = await outcomeWithin(
      app.claimCheck.publish(UNCONSUMED, slowSource(bytes(1_000, 4), 4, 100)),
    );

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect((outcome as { error: PayloadStoreTimeoutError }).error).toMatchObject({
      call: 'markPublished',
      timeoutMs: READ_TIMEOUT_MS,
    });
    expect(transport.attempts).toEqual([]);
    expect(await filesUnder(app.root)).toEqual([]);
  });

  it('an upload the store stops taking: PayloadStoreTimeoutError after writeTimeoutMs, the source destroyed, nothing published nor left', async () => {
    const app = await boot();
    store.hangPuts = 1;
    const source = Readable.from(Array.from({ length: 64 }, (_, i) => bytes(16 * 1024, i)));
    const startedAt = Date.now();

    const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, source));

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect((outcome as { error: PayloadStoreTimeoutError }).error).toMatchObject({
      call: 'put',
      ref: '',
      timeoutMs: WRITE_TIMEOUT_MS,
    });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(WRITE_TIMEOUT_MS);
    await eventually(() => source.destroyed, 'the source destroyed');
    expect(transport.attempts).toEqual([]);
    // The store answers again: the put it was given finds its payload failed, and keeps nothing.
    await store.releasePuts();
    await eventually(async () => (await filesUnder(app.root)).length === 0, 'nothing stored');
  });

  it('a store that takes every byte, then neither reads the end nor answers: PayloadStoreTimeoutError after writeTimeoutMs', async () => {
    const app = await boot();
    const payload = bytes(64 * 1024, 12);
    store.stallPutsAfter = payload.length;
    const startedAt = Date.now();

    const outcome = await outcomeWithin(
      app.claimCheck.publish(UNCONSUMED, Readable.from([payload])),
    );

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(WRITE_TIMEOUT_MS);
    expect(transport.attempts).toEqual([]);
  });

  it('a store slower than writeTimeoutMs over the upload, but taking bytes steadily: the publish goes through', async () => {
    const app = await boot();
    const payload = bytes(256 * 1024, 13);
    store.putChunkDelayMs = WRITE_TIMEOUT_MS / 3;

    const outcome = await outcomeWithin(
      app.claimCheck.publish(
        UNCONSUMED,
        Readable.from(
          Array.from({ length: 8 }, (_, i) => payload.subarray(i * 32_768, (i + 1) * 32_768)),
        ),
      ),
    );

    await expectStoredWhole(app, outcome, payload);
  });

  it('a put of bytes that never answers: PayloadStoreTimeoutError; stored late, the payload is deleted', async () => {
    const app = await boot();
    const events = recordEvents(app.app);
    store.hangPuts = 1;

    const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, bytes(1_000, 9)));

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect((outcome as { error: PayloadStoreTimeoutError }).error).toMatchObject({ call: 'put' });
    expect(transport.attempts).toEqual([]);
    await store.releasePuts();
    await eventually(
      () => warnings.some((warning) => /answered a put given up on/.test(warning)),
      'the late put reported',
    );
    await eventually(async () => (await filesUnder(app.root)).length === 0, 'the payload deleted');
    // Reported as every other deletion is.
    await eventually(() => events.only('claim.deleted').length === 1, 'claim.deleted');
    expect(events.only('claim.deleted')[0]).toMatchObject({ channel: '', reason: 'orphaned' });
  });

  it('a checkIn whose put answers late: PayloadStoreTimeoutError, and the payload, marked published, is deleted', async () => {
    const app = await boot();
    store.hangPuts = 1;

    const outcome = await outcomeWithin(app.claimCheck.checkIn(bytes(1_000, 14)));

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    await store.releasePuts();
    await eventually(async () => (await filesUnder(app.root)).length === 0, 'the payload deleted');
  });

  it('a put of bytes over 8 MiB the store takes none of: PayloadStoreTimeoutError after writeTimeoutMs', async () => {
    const app = await boot();
    store.hangPuts = 1;
    const startedAt = Date.now();

    const outcome = await outcomeWithin(
      app.claimCheck.publish(UNCONSUMED, bytes(9 * 1024 * 1024, 10)),
    );

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(WRITE_TIMEOUT_MS);
    await store.releasePuts();
    await eventually(async () => (await filesUnder(app.root)).length === 0, 'nothing stored');
  });

  it('a source slower than writeTimeoutMs between its chunks: waiting on it is not the store holding the upload', async () => {
    const app = await boot();
    const payload = bytes(1_000, 11);

    const outcome = await outcomeWithin(
      app.claimCheck.publish(UNCONSUMED, slowSource(payload, 3, 2 * WRITE_TIMEOUT_MS)),
    );

    await expectStoredWhole(app, outcome, payload);
  });

  it('fragments sent via claim check whose marks never answer: the send resolves', async () => {
    const app = await boot();
    store.hangMarks = 1_000;

    const outcome = await outcomeWithin(
      app.app.get(SplitterService).send(UNCONSUMED, bytes(2_000, 5), {
        via: 'claim-check',
        fragmentBytes: 1_024,
      }),
    );

    expect(outcome).toEqual({ value: expect.objectContaining({ fragments: 2 }) });
    expect(app.transport.depth(UNCONSUMED)).toBe(2);
  });

  it('release() by hand whose delete never answers: rejects with PayloadStoreTimeoutError after readTimeoutMs', async () => {
    const app = await boot();
    const ticket = await app.claimCheck.checkIn(bytes(1_000, 8));
    store.hangDeletes = 1;
    const startedAt = Date.now();

    const outcome = await outcomeWithin(app.claimCheck.release(ticket));

    expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
    expect((outcome as { error: PayloadStoreTimeoutError }).error).toMatchObject({
      call: 'delete',
      ref: ticket.ref,
      timeoutMs: READ_TIMEOUT_MS,
    });
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(READ_TIMEOUT_MS);
    // Not deleted: released again once the store answers.
    expect(await app.claimCheck.release(ticket)).toBe(true);
  });

  it("a parked fragment body whose delete never answers: its consumer's release gives up after readTimeoutMs, and says when it expires", async () => {
    const app = await boot();
    const payload = bytes(2_000, 6);
    store.hangDeletes = 1_000;
    await app.app
      .get(SplitterService)
      .send(app.channel, payload, { via: 'claim-check', fragmentBytes: 1_024 });
    await app.transport.whenIdle();

    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    await eventually(
      () =>
        warnings.filter((warning) => /could not delete parked .* expires at/.test(warning))
          .length === 2,
      'both releases given up on',
    );
    expect(warnings).toContainEqual(
      expect.stringMatching(/did not answer delete .* within 300 ms/),
    );
  });
});

/**
 * The same against a real store: a RedisPayloadStore whose connection to the real Redis goes
 * through a proxy that freezes part-way through the upload, or the moment the ticket is
 * published, after it. ioredis has no command timeout of its own: the step waits for an answer
 * that never comes.
 */
describeWithServer(
  'redis',
  'claim check: a Redis payload store that freezes during or after the upload',
  () => {
    const redis = useRedis({ stem: 'nseq-test-frozen-mark' });
    let proxy: FreezingProxy | undefined;
    let client: Redis | undefined;
    let t: ClaimCheckTestApp | undefined;
    afterEach(async () => {
      await t?.close();
      client?.disconnect();
      await proxy?.close();
      t = client = proxy = undefined;
    });

    it('an upload that freezes part-way: publish() rejects after writeTimeoutMs, and once the link is back nothing is left', async () => {
      const writeTimeoutMs = 1_000;
      ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
      const frozen = proxy;
      const store = new RedisPayloadStore(client, { prefix: redis.prefix, chunkBytes: 64 * 1024 });
      const app = (t = await createClaimCheckTestApp({
        claimCheck: { store, writeTimeoutMs, inlineMaxBytes: 100 },
      }));
      const source = Readable.from(
        (async function* () {
          for (let i = 0; i < 64; i++) {
            if (i === 8) frozen.freeze();
            yield bytes(64 * 1024, i);
          }
        })(),
      );
      const startedAt = Date.now();

      const outcome = await outcomeWithin(app.claimCheck.publish(UNCONSUMED, source), 10_000);

      expect(outcome).toEqual({ error: expect.any(PayloadStoreTimeoutError) });
      expect((outcome as { error: PayloadStoreTimeoutError }).error).toMatchObject({
        store: 'redis',
        call: 'put',
      });
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(writeTimeoutMs);
      await eventually(() => source.destroyed, 'the source destroyed');
      expect(app.transport.depth(UNCONSUMED)).toBe(0);
      frozen.resume(); // the link is reset; ioredis reconnects, and the put removes what it wrote
      await eventually(
        async () => (await keysUnder(redis.client, redis.prefix)).length === 0,
        "the upload's chunks removed",
        10_000,
      );
    });

    it('publish() resolves after readTimeoutMs, and the payload is marked published once the link is back', async () => {
      const readTimeoutMs = 1_000;
      ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
      const frozen = proxy;
      const store = new RedisPayloadStore(client, { prefix: redis.prefix });
      let transport!: FaultInjectingTransport;
      const app = (t = await createClaimCheckTestApp({
        claimCheck: { store, readTimeoutMs, inlineMaxBytes: 100 },
        wrapTransport: (inner) => (transport = new FaultInjectingTransport(inner)),
      }));
      transport.beforePublish = ({ channel }) => {
        if (channel === UNCONSUMED) frozen.freeze();
      };
      const startedAt = Date.now();

      const outcome = await outcomeWithin(
        app.claimCheck.publish(UNCONSUMED, bytes(1_000, 7)),
        10_000,
      );

      expect(outcome).toEqual({ value: expect.objectContaining({ via: 'ticket' }) });
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(readTimeoutMs);
      expect(app.transport.depth(UNCONSUMED)).toBe(1);
      const { ref } = (outcome as { value: { ticket: { ref: string } } }).value.ticket;
      frozen.resume(); // the link is reset; ioredis reconnects
      await eventually(
        async () => (await store.head(ref))?.published === true,
        'the payload marked published',
        10_000,
      );
    });
  },
);
