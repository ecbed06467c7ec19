import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { Controller, Logger, type Type } from '@nestjs/common';
import { Ctx, EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom, Observable } from 'rxjs';
import {
  FilesystemPayloadStore,
  HandlerTimeoutError,
  InMemoryTransport,
  type SequenceModuleOptions,
} from 'nest-sequence';
import type { GetOptions, HeaderMap, PublishOptions } from 'nest-sequence/ports';
import {
  ReplyTimeoutError,
  ReplyUnreadableError,
  type SequenceContext,
} from 'nest-sequence/microservices';
import { FaultInjectingPayloadStore } from '../claim-check/fault-injecting.payload-store';
import { CountedReplies } from './counted-replies.transport';
import { eventually } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

const TIMEOUT_MS = 30;
const signals: AbortSignal[] = [];
/** Subscriptions to the Observables `ms.ticking` returned, and those let go of. */
const ticking = { subscribed: 0, unsubscribed: 0 };

@Controller()
class StuckController {
  @EventPattern('ms.stuck')
  stuck(@Payload() _data: unknown, @Ctx() ctx: SequenceContext): Promise<void> {
    signals.push(ctx.getSignal());
    return new Promise<void>(() => undefined); // never settles
  }

  @EventPattern('ms.ticking')
  tick(): Observable<number> {
    // Never completes: a feed, a poll.
    return new Observable<number>((subscriber) => {
      ticking.subscribed += 1;
      const timer = setInterval(() => subscriber.next(Date.now()), 5);
      return () => {
        ticking.unsubscribed += 1;
        clearInterval(timer);
      };
    });
  }

  @EventPattern('ms.free')
  free(@Payload() _data: unknown, @Ctx() ctx: SequenceContext): void {
    signals.push(ctx.getSignal());
  }
}

describe('microservices: an @EventPattern handler that runs past handlerTimeoutMs', () => {
  const transport = new InMemoryTransport();
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 } },
      controllers: [StuckController],
      server: {
        channels: {
          'ms.stuck': { handlerTimeoutMs: TIMEOUT_MS },
          'ms.ticking': { handlerTimeoutMs: TIMEOUT_MS },
        },
      },
    });
  });
  afterAll(() => t?.close());
  beforeEach(() => (signals.length = 0));

  const emit = (pattern: string, data: unknown) =>
    lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });

  it("aborts @Ctx()'s signal, retries, then dead-letters the message handler-timeout", async () => {
    await emit('ms.stuck', { study: 'CT-9' });
    await transport.whenIdle();

    expect(signals).toHaveLength(2);
    expect(signals.every((signal) => signal.reason instanceof HandlerTimeoutError)).toBe(true);
    const dead = transport.take(transport.deadLetterChannel('ms.stuck'));
    expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
      expect.stringMatching(
        new RegExp(`^handler-timeout: an inline payload: handler timed out after ${TIMEOUT_MS} ms`),
      ),
    ]);
  });

  it('unsubscribes from the Observable of a call it abandoned', async () => {
    await emit('ms.ticking', { feed: 'vitals' });
    await transport.whenIdle();

    const dead = transport.take(transport.deadLetterChannel('ms.ticking'));
    expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
      expect.stringMatching(/^handler-timeout: /),
    ]);
    // Each call's Observable is let go of as it is abandoned: no interval runs on.
    expect(ticking).toEqual({ subscribed: 2, unsubscribed: 2 });
  });

  it('hands a signal that is never aborted to a channel without a limit', async () => {
    await emit('ms.free', { study: 'CT-10' });
    await transport.whenIdle();

    expect(signals).toHaveLength(1);
    expect(signals[0].aborted).toBe(false);
  });
});

/** Subscriptions to the Observables `sd.*` returned, those let go of, and their values. */
const feeds = { subscribed: 0, unsubscribed: 0, values: 0 };

/** An Observable that never completes (a feed, a poll), counted in `feeds`. */
function endlessFeed(): Observable<number> {
  return new Observable<number>((subscriber) => {
    feeds.subscribed += 1;
    const timer = setInterval(() => {
      feeds.values += 1;
      subscriber.next(Date.now());
    }, 5);
    return () => {
      feeds.unsubscribed += 1;
      clearInterval(timer);
    };
  });
}

@Controller()
class EndlessFeeds {
  @EventPattern('sd.feed')
  feed(): Observable<number> {
    return endlessFeed();
  }

  @MessagePattern('sd.quote')
  quote(): Observable<number> {
    return endlessFeed();
  }
}

describe('microservices: an Observable that never completes, at shutdown', () => {
  it('is unsubscribed once the shutdown stops waiting for it; its message goes back', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport, shutdownTimeoutMs: 200 },
      controllers: [EndlessFeeds],
    });
    await lastValueFrom(t.client.emit('sd.feed', { feed: 'vitals' }), { defaultValue: undefined });
    const asked = lastValueFrom(t.client.send('sd.quote', { sku: 'A-1' })).catch(
      (error: unknown) => error,
    );
    await eventually(() => feeds.subscribed === 2, 'both handlers subscribed to');

    const closing = Date.now();
    await t.close();
    expect(Date.now() - closing).toBeLessThan(2_000);
    expect(await asked).toMatchObject({ code: 'client-closed' });
    const valuesAtClose = feeds.values;
    await new Promise((resolve) => setTimeout(resolve, 100));

    // No interval runs on after the application closed, and neither message was settled.
    expect(feeds).toEqual({ subscribed: 2, unsubscribed: 2, values: valuesAtClose });
    expect(transport.depth('sd.feed') + transport.depth('sd.quote')).toBe(2);
    await transport.close();
  });
});

let quotes = 0;
let deadLettersRead = 0;
/** The streams `rr.late-stream` returned, each after its call was abandoned. */
const lateReplies: Readable[] = [];

@Controller()
class SlowAnswers {
  @MessagePattern('rr.stuck')
  stuck(): Promise<string> {
    return new Promise<string>(() => undefined); // never settles
  }

  @MessagePattern('rr.stuck-read')
  stuckToo(): Promise<string> {
    return new Promise<string>(() => undefined);
  }

  /** Reads rr.stuck-read's dead letters back: requests, their reply headers kept. */
  @EventPattern('rr.stuck-read.dlq')
  readBack(): void {
    deadLettersRead++;
  }

  @MessagePattern('rr.late-stream')
  async lateStream(): Promise<Readable> {
    // Opens its reply (a file, say) only after the limit: a call that was abandoned.
    await new Promise((resolve) => setTimeout(resolve, 4 * TIMEOUT_MS));
    const reply = new Readable({ read() {} });
    lateReplies.push(reply);
    return reply;
  }

  @MessagePattern('rr.slow-reply')
  slowReply(): Readable {
    quotes++;
    // Returned at once; the reply's bytes take longer than the limit to go out.
    let left = 5;
    return new Readable({
      read() {
        const chunk = left-- > 0 ? Buffer.alloc(1024, 7) : null;
        setTimeout(() => this.push(chunk), 4 * TIMEOUT_MS);
      },
    });
  }
}

describe('microservices: a @MessagePattern handler and handlerTimeoutMs', () => {
  const inner = new InMemoryTransport();
  const transport = new CountedReplies(inner);
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 } },
      controllers: [SlowAnswers],
      server: {
        channels: {
          'rr.stuck': { handlerTimeoutMs: TIMEOUT_MS },
          'rr.stuck-read': { handlerTimeoutMs: TIMEOUT_MS },
          'rr.slow-reply': { handlerTimeoutMs: TIMEOUT_MS },
          'rr.late-stream': { handlerTimeoutMs: TIMEOUT_MS },
        },
      },
      client: { replyTimeoutMs: 5_000 },
    });
  });
  afterAll(() => t?.close());

  const ask = (pattern: string, data: unknown) => lastValueFrom(t.client.send(pattern, data));

  it('errors send() at once, saying why, when the request is dead-lettered handler-timeout', async () => {
    const asked = Date.now();
    await expect(ask('rr.stuck', { sku: 'A-1' })).rejects.toEqual({
      status: 'error',
      message: expect.stringMatching(
        new RegExp(`^handler-timeout: .*handler timed out after ${TIMEOUT_MS} ms.*after 2 call`),
      ) as unknown,
    });
    expect(Date.now() - asked).toBeLessThan(2_000); // not at replyTimeoutMs (5 s)
    await inner.whenIdle();
    const dead = inner.take(inner.deadLetterChannel('rr.stuck'));
    expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
      expect.stringMatching(/^handler-timeout: /),
    ]);
  });

  it('does not run a handler again because its reply took longer than the limit to send', async () => {
    quotes = 0;
    const reply = (await ask('rr.slow-reply', {})) as Buffer;
    expect(reply).toEqual(Buffer.alloc(5 * 1024, 7));
    await inner.whenIdle();
    expect(quotes).toBe(1);
    expect(inner.take(inner.deadLetterChannel('rr.slow-reply'))).toHaveLength(0);
  });

  it('destroys the stream an abandoned call returns, which is never sent', async () => {
    await expect(ask('rr.late-stream', {})).rejects.toMatchObject({
      message: expect.stringMatching(/^handler-timeout: /) as unknown,
    });
    await eventually(() => lateReplies.length === 2, 'both calls returned');
    await eventually(
      () => lateReplies.every((reply) => reply.destroyed),
      'the unsent replies destroyed',
    );
  });

  it('never answers a dead-lettered request again when a handler reads its dead letter', async () => {
    transport.replies = 0;
    await expect(ask('rr.stuck-read', {})).rejects.toMatchObject({ status: 'error' });
    await eventually(() => deadLettersRead === 1, 'the dead letter read back');
    await inner.whenIdle();
    expect(transport.replies).toBe(1);
  });
});

/** Delays each reply's publish past the handlers' limit; counts the replies published. */
class SlowReplies extends CountedReplies {
  override readonly name = 'slow-replies';

  override async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    if (this.isReplyChannel?.(channel) === true) {
      await new Promise((resolve) => setTimeout(resolve, 4 * TIMEOUT_MS));
    }
    return super.publish(channel, body, headers, options);
  }
}

let heard = 0;

@Controller()
class OnlyEvents {
  @EventPattern('nh.event')
  event(): void {
    heard++;
  }

  @MessagePattern('nh.known')
  known(): string {
    return 'known';
  }
}

describe('microservices: a no-handler reply and handlerTimeoutMs', () => {
  const inner = new InMemoryTransport();
  const transport = new SlowReplies(inner);
  const channelOf = (pattern: string) => (pattern.startsWith('nh.shared.') ? 'nh.known' : pattern);
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 } },
      controllers: [OnlyEvents],
      server: {
        channelOf,
        channels: {
          'nh.event': { handlerTimeoutMs: TIMEOUT_MS },
          'nh.known': { handlerTimeoutMs: TIMEOUT_MS },
        },
      },
      client: { channelOf, replyTimeoutMs: 5_000 },
    });
  });
  afterAll(async () => {
    await t?.close();
    await inner.close();
  });
  beforeEach(() => {
    transport.replies = 0;
    heard = 0;
  });

  const ask = (pattern: string, data: unknown) => lastValueFrom(t.client.send(pattern, data));

  it('answers a request no handler takes once, however long its reply takes to send', async () => {
    await expect(ask('nh.shared.unknown', {})).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^no-handler: /) as unknown,
    });
    await inner.whenIdle();
    expect(transport.replies).toBe(1);
    const dead = inner.take(inner.deadLetterChannel('nh.known'));
    expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
      expect.stringMatching(/^no-handler: /),
    ]);
  });

  it('runs the @EventPattern handlers of a request once, in time, however long its refusal takes to send', async () => {
    const warnings: string[] = [];
    const spy = jest
      .spyOn(Logger.prototype, 'warn')
      .mockImplementation((message: unknown) => void warnings.push(String(message)));
    try {
      await expect(ask('nh.event', {})).rejects.toMatchObject({
        status: 'error',
        message: expect.stringMatching(/^no-handler: .*no @MessagePattern/) as unknown,
      });
      await inner.whenIdle();
      // An abandoned call goes on unseen: long enough for one to have run the handler too.
      await new Promise((resolve) => setTimeout(resolve, 8 * TIMEOUT_MS));
    } finally {
      spy.mockRestore();
    }
    // The first call ran the handler within its limit: no call failed, none was abandoned.
    expect(warnings.filter((warning) => warning.includes('nh.event'))).toEqual([]);
    expect(heard).toBe(1);
    expect(transport.replies).toBe(1);
    expect(inner.take(inner.deadLetterChannel('nh.event'))).toHaveLength(0);
  });
});

/** Takes `readDelayMs` to open each payload it is asked for, as a store far away does. */
class SlowReads extends FaultInjectingPayloadStore {
  readDelayMs = 0;

  override async get(ref: string, options?: GetOptions): Promise<Readable> {
    await delay(this.readDelayMs, options?.signal);
    // Given up on meanwhile: not a read that counts against failGets.
    options?.signal?.throwIfAborted();
    return super.get(ref);
  }
}

function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
  });
}

/** 10 KiB: past `sequenceMaxBytes` (2 KiB), so the reply goes behind a claim ticket. */
const TICKETED = 10 * 1024;

@Controller()
class Reports {
  @MessagePattern('rr.report')
  report(): Buffer {
    return Buffer.alloc(TICKETED, 7);
  }
}

/**
 * An app of `controller` whose replies past 2 KiB go behind a claim ticket, in a store of a
 * temporary directory that `store` wraps; `close()` closes it and deletes the directory.
 */
async function ticketedReplies<S extends FaultInjectingPayloadStore>(
  transport: InMemoryTransport,
  store: (inner: FilesystemPayloadStore) => S,
  controller: Type,
  options: { replyTimeoutMs: number } & Partial<SequenceModuleOptions>,
): Promise<MicroserviceTestApp & { store: S }> {
  const dir = await mkdtemp(join(tmpdir(), 'reply-reads-'));
  const wrapped = store(new FilesystemPayloadStore({ root: dir }));
  const { replyTimeoutMs, ...sequence } = options;
  const t = await createMicroserviceTestApp({
    sequence: {
      ...sequence,
      transport,
      claimCheck: { store: wrapped, inlineMaxBytes: 1024, sequenceMaxBytes: 2048 },
    },
    controllers: [controller],
    client: { replyTimeoutMs },
  });
  const close = async () => {
    await t.close();
    await rm(dir, { recursive: true, force: true });
  };
  return { ...t, store: wrapped, close };
}

describe("microservices: reading a reply, whatever the module's handlerTimeoutMs", () => {
  const transport = new InMemoryTransport();
  const REPLY_TIMEOUT_MS = 1_000;
  let store: SlowReads;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    ({ store, ...t } = await ticketedReplies(transport, (inner) => new SlowReads(inner), Reports, {
      replyTimeoutMs: REPLY_TIMEOUT_MS,
      handlerTimeoutMs: TIMEOUT_MS,
      handlerRetry: { attempts: 1 },
    }));
  });
  afterAll(() => t?.close());
  afterEach(() => {
    store.readDelayMs = 0;
    store.failGets = 0;
  });

  const ask = () => lastValueFrom(t.client.send('rr.report', {}));

  it('reads a claim-checked reply that takes longer than handlerTimeoutMs to read', async () => {
    store.readDelayMs = 10 * TIMEOUT_MS;
    await expect(ask()).resolves.toEqual(Buffer.alloc(TICKETED, 7));
  });

  it('errors send() with ReplyTimeoutError when reading its reply outlasts replyTimeoutMs', async () => {
    store.readDelayMs = 3 * REPLY_TIMEOUT_MS;
    await expect(ask()).rejects.toBeInstanceOf(ReplyTimeoutError);
  });

  it('errors send() with ReplyUnreadableError when its reply cannot be read from the store', async () => {
    store.failGets = 1;
    const error: unknown = await ask().then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(ReplyUnreadableError);
    expect(error).toMatchObject({ code: 'reply-unreadable', pattern: 'rr.report' });
    expect((error as Error).message).toMatch(
      /^the reply to rr\.report \(correlation id [^)]+\) came but could not be read: payload store unreachable/,
    );
    expect((error as Error).cause).toBeInstanceOf(Error);
  });
});

/** A read of the store: how many chunks it handed out, and when it was closed, if it was. */
interface TrickledRead {
  chunks: number;
  closedAt?: number;
}

/** Hands each payload out 1 KiB at a time, one chunk every `chunkMs`, as a slow link does. */
class TricklingReads extends FaultInjectingPayloadStore {
  chunkMs = 100;
  readonly reads: TrickledRead[] = [];

  override async get(ref: string): Promise<Readable> {
    const whole = Buffer.concat(await (await super.get(ref)).toArray());
    const read: TrickledRead = { chunks: 0 };
    this.reads.push(read);
    const { chunkMs } = this;
    let offset = 0;
    let timer: NodeJS.Timeout | undefined;
    return new Readable({
      read() {
        timer = setTimeout(() => {
          const chunk = offset < whole.length ? whole.subarray(offset, offset + 1024) : null;
          offset += 1024;
          if (chunk) read.chunks++;
          this.push(chunk);
        }, chunkMs);
      },
      destroy(error, callback) {
        clearTimeout(timer);
        read.closedAt = Date.now();
        callback(error);
      },
    });
  }
}

@Controller()
class SlowReports {
  @MessagePattern('rr.trickled')
  report(): Buffer {
    return Buffer.alloc(TICKETED, 7);
  }

  @MessagePattern('rr.late-trickled')
  async late(): Promise<Buffer> {
    await new Promise((resolve) => setTimeout(resolve, 300));
    return Buffer.alloc(TICKETED, 7);
  }
}

describe('microservices: a reply whose caller is gone while it is read', () => {
  const transport = new InMemoryTransport();
  let store: TricklingReads;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    const trickling = (inner: FilesystemPayloadStore) => new TricklingReads(inner);
    ({ store, ...t } = await ticketedReplies(transport, trickling, SlowReports, {
      replyTimeoutMs: 500,
    }));
  });
  afterAll(() => t?.close());
  beforeEach(() => (store.reads.length = 0));

  it('stops reading the reply of a send() its caller unsubscribed from', async () => {
    // 10 chunks, 100 ms apart: a read of 1 s, past the reply's own time limit (500 ms).
    const deletes = store.calls.delete;
    const asked = t.client.send('rr.trickled', {}).subscribe({ error: () => undefined });
    await eventually(() => store.reads[0]?.chunks === 2, 'the reply being read');
    const unsubscribedAt = Date.now();
    asked.unsubscribe();

    await eventually(() => store.reads[0].closedAt !== undefined, 'the read closed', 2_000);
    expect(store.reads[0].closedAt! - unsubscribedAt).toBeLessThan(150);
    expect(store.reads[0].chunks).toBeLessThan(5);
    await transport.whenIdle();
    // Settled and deleted from the store, as a reply read whole: nobody waits for it.
    expect(transport.depth(transport.deadLetterChannel('rr.trickled'))).toBe(0);
    expect(store.calls.delete - deletes).toBe(1);
  });

  it('stops reading the reply of a send() whose replyTimeoutMs passed', async () => {
    // Answered after 300 ms: the request times out 200 ms into its reply's read.
    const error = lastValueFrom(t.client.send('rr.late-trickled', {})).catch(
      (caught: unknown) => caught,
    );
    expect(await error).toBeInstanceOf(ReplyTimeoutError);
    const timedOutAt = Date.now();

    await eventually(() => store.reads[0]?.closedAt !== undefined, 'the read closed', 2_000);
    expect(store.reads[0].closedAt! - timedOutAt).toBeLessThan(150);
  });
});
