import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import type { ClaimedPayload, PayloadStore } from 'nest-sequence';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * A handler may read only part of its payload (sniffing a header, say). What it left open in the
 * payload store (a file handle, a pooled S3 socket) is closed once the handler returned, and
 * before a call that failed or timed out is retried.
 */
/** Takes the first chunk and walks away, leaving the stream paused (not destroyed). */
async function firstChunkOnly(payload: ClaimedPayload): Promise<Buffer> {
  const stream = payload.stream();
  const first = await new Promise<Buffer>((resolve) => stream.once('data', resolve));
  stream.pause();
  return first;
}

describe('claim check: a handler that reads part of its payload', () => {
  let t: ClaimCheckTestApp;
  const opened: Readable[] = [];

  /** Records every stream the filesystem store opens. */
  const recordingStore = (inner: PayloadStore): PayloadStore =>
    new Proxy(inner, {
      get: (target, property, receiver): unknown =>
        property === 'get'
          ? async (ref: string) => {
              const stream = await target.get(ref);
              opened.push(stream);
              return stream;
            }
          : Reflect.get(target, property, receiver),
    });

  beforeEach(() => {
    opened.length = 0;
  });
  afterEach(() => t.close());

  it('has the store stream it left half-read closed after it returned', async () => {
    t = await createClaimCheckTestApp({ wrapStore: recordingStore });
    // Several MiB: the filesystem stream reads it in many chunks, so one chunk is a partial read.
    const ticket = await t.claimCheck.checkIn(bytes(4 * 1024 * 1024, 3), { audience: t.channel });
    t.handler.read = firstChunkOnly;

    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.length).toBeLessThan(4 * 1024 * 1024);
    expect(opened).toHaveLength(1);
    expect(opened[0].destroyed).toBe(true);
  });

  describe('before its call is retried', () => {
    // The retry waits 400 ms (its backoff); the first call's stream is looked at 50 ms after the
    // call ended (failed at once, or timed out after 2 s), while that backoff runs. The time limit
    // holds for the retry too, which reads 4 MiB whole: 2 s leaves a loaded machine room.
    it.each([
      [
        'failed',
        {},
        50,
        () => Promise.reject(new Error('the first call fails after a partial read')),
      ],
      // Timed out, the first call is abandoned while it still waits to read on.
      ['timed out', { handlerTimeoutMs: 2_000 }, 2_050, () => new Promise<never>(() => undefined)],
    ])(
      'closes the store stream a %s call left half-read at once, and the retry reads the payload whole',
      async (_label, limits, lookAfterMs, then) => {
        t = await createClaimCheckTestApp({
          handlers: [
            {
              channel: 'cc.test',
              handlerRetry: { attempts: 2, baseDelayMs: 400, maxDelayMs: 400 },
              ...limits,
            },
          ],
          wrapStore: recordingStore,
        });
        const payload = bytes(4 * 1024 * 1024, 3);
        const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
        const firstClosedInBackoff: boolean[] = [];
        let calls = 0;
        t.handler.read = async (claimed) => {
          calls += 1;
          if (calls === 1) {
            await firstChunkOnly(claimed);
            setTimeout(() => firstClosedInBackoff.push(opened[0].destroyed), lookAfterMs);
            return then();
          }
          return claimed.toBuffer();
        };

        await publishTicket(t.transport, t.channel, ticket);
        await t.transport.whenIdle();

        expect(calls).toBe(2);
        expect(firstClosedInBackoff).toEqual([true]);
        expect(t.handler.deliveries).toHaveLength(1);
        expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
        expect(t.transport.actionsOn(t.channel)).toEqual(['ack']);
      },
    );
  });

  it('closes a store stream that stalled after its first chunk, at once', async () => {
    // A store whose stream gives one chunk, then waits (a slow disk, a stalled socket): reading
    // on would wait for its next chunk, so closing cannot be left to the reader.
    t = await createClaimCheckTestApp({
      wrapStore: (inner): PayloadStore =>
        new Proxy(inner, {
          get: (target, property, receiver): unknown =>
            property === 'get'
              ? () => {
                  let given = false;
                  const stream = new Readable({
                    read() {
                      if (!given) this.push(Buffer.alloc(1024, 1));
                      given = true;
                    },
                  });
                  opened.push(stream);
                  return Promise.resolve(stream);
                }
              : Reflect.get(target, property, receiver),
        }),
    });
    const ticket = await t.claimCheck.checkIn(bytes(64 * 1024, 5), { audience: t.channel });
    t.handler.read = firstChunkOnly;

    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.length).toBe(1024);
    expect(opened).toHaveLength(1);
    expect(opened[0].destroyed).toBe(true);
  });

  it('closes a store stream that stalled before its first byte once the handler was abandoned, encrypted too', async () => {
    // Encrypted at rest, the store's get reads the header before it resolves: the stream is not
    // the handler's yet, and only the payload's close can end the wait.
    t = await createClaimCheckTestApp({
      handlers: [{ channel: 'cc.test', handlerTimeoutMs: 200, handlerRetry: { attempts: 1 } }],
      claimCheck: { encryption: { keys: [{ id: 'k1', key: randomBytes(32) }] } },
      wrapStore: (inner): PayloadStore =>
        new Proxy(inner, {
          get: (target, property, receiver): unknown =>
            property === 'get'
              ? () => {
                  const stream = new Readable({ read() {} }); // never gives a byte
                  opened.push(stream);
                  return Promise.resolve(stream);
                }
              : Reflect.get(target, property, receiver),
        }),
    });
    const ticket = await t.claimCheck.checkIn(bytes(64 * 1024, 5), { audience: t.channel });

    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(deathReasons(t.transport, t.channel)[0]).toMatch(/^handler-timeout/);
    expect(opened).toHaveLength(1);
    // Through the decrypting stream's pipeline, a tick or two after the close.
    await eventually(() => opened[0].destroyed, 'the stalled store stream destroyed', 1_000);
  });
});
