import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { Logger, type BeforeApplicationShutdown } from '@nestjs/common';
import { ClientProxy, type ReadPacket, type WritePacket } from '@nestjs/microservices';
import { InvalidMessageException } from '@nestjs/microservices/errors/invalid-message.exception';
import { defer, mergeMap, Observable, throwError } from 'rxjs';
import type { ClaimedPayload } from '../claim-check/claimed-payload';
import { settlesWithin } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { HeaderMap } from '../core/headers';
import { isRecordSource } from '../core/payload-source';
import { checkDelay, checkInteger } from '../core/option-checks';
import { checkedBeforeReading, destroySource, holdSourceErrors } from '../core/refused-source';
import { checkKeys, SEQUENCE_CLIENT_KEYS } from '../options/option-keys';
import type { Subscription } from '../ports/transport.port';
import { ClientClosedError } from './errors/client-closed.error';
import { ReplyNotSupportedError } from './errors/reply-not-supported.error';
import { ReplyTimeoutError } from './errors/reply-timeout.error';
import { ReplyUnreadableError } from './errors/reply-unreadable.error';
import { channelOfOption } from './channel-of';
import {
  DEFAULT_DECODE_LIMITS,
  decodePayload,
  encodePayload,
  publishOptionsOf,
} from './payload.codec';
import { headerString, RpcHeader, withRpcHeaders } from './rpc-headers';
import { ATTACH_RUNTIME, type SequenceRuntime } from './sequence-runtime';
import { SequenceRecord } from './sequence.record';

export interface SequenceClientOptions {
  /** How long `send()` waits for its reply before it errors with ReplyTimeoutError. @default 30000 */
  readonly replyTimeoutMs?: number;
  /** The channel a pattern is sent to (as the server's `channelOf`). @default the pattern itself */
  readonly channelOf?: (pattern: string) => string;
  /** Payloads up to this many bytes go in one message. @default claimCheck.inlineMaxBytes */
  readonly inlineMaxBytes?: number;
  /** Payloads up to this many bytes go as a Message Sequence, larger ones behind a ticket. @default claimCheck.sequenceMaxBytes */
  readonly sequenceMaxBytes?: number;
  /** The largest JSON reply parsed. @default 16 MiB */
  readonly maxJsonBytes?: number;
  /** The largest reply read (a reply is read whole into memory). @default 256 MiB */
  readonly maxReplyBytes?: number;
}

interface PendingRequest {
  readonly pattern: string;
  readonly callback: (packet: WritePacket) => void;
  /** Set once the request is confirmed: the wait for its reply. */
  timer: NodeJS.Timeout | undefined;
  /** Set while its reply is read: cuts the read short, once nobody waits for the reply. */
  stopReading?: () => void;
  /**
   * Aborted once nobody waits for the reply: a request still being sent (a sequence's fragments,
   * a payload being parked) stops there, its stream destroyed.
   */
  readonly sending: AbortController;
}

/**
 * A `ClientProxy` over the application's `SequenceModule`, for
 * `ClientsModule.register([{ name, customClass: SequenceClient, options }])`:
 * - `emit(pattern, data)` sends by size: inline, as a Message Sequence, or behind a claim ticket.
 *   `data` is a Buffer, a Readable, records (`{ records }`), a {@link SequenceRecord} or any
 *   JSON value. Once the transport confirmed every message the Observable emits `undefined` and
 *   completes (so `lastValueFrom` needs no default); the send starts at once, subscribed or not,
 *   and a failure nobody subscribed to is logged as an error.
 *   The application's shutdown (and `close()`) waits for the sends under way to be confirmed or
 *   to fail, before the module's stores and the transport close.
 * - `send(pattern, data)` is request-reply, where the transport routes replies (in-memory,
 *   RabbitMQ, NATS JetStream): the reply travels by the same size rule. A request still being
 *   sent when nobody waits for its reply any more (it timed out, was unsubscribed, the client
 *   closed) stops there: its stream is destroyed, no further fragment or ticket is published.
 *
 * @example
 * ClientsModule.register([{ name: 'IMAGING', customClass: SequenceClient, options: {} }])
 * // ...
 * await lastValueFrom(client.emit('imaging.ai.intake', new SequenceRecord(stream, { bytes })));
 */
export class SequenceClient extends ClientProxy implements BeforeApplicationShutdown {
  private readonly logger = new Logger('SequenceClient');
  private runtime: SequenceRuntime | undefined;
  private replies: Promise<Subscription> | undefined;
  private readonly pending = new Map<string, PendingRequest>();
  /** `emit()` sends not settled yet: a shutdown waits for them. */
  private readonly sending = new Set<Promise<unknown>>();
  private readonly settings: {
    replyTimeoutMs: number;
    channelOf: (pattern: string) => string;
    maxJsonBytes: number;
    maxReplyBytes: number;
    inlineMaxBytes?: number;
    sequenceMaxBytes?: number;
  };

  constructor(options: SequenceClientOptions = {}) {
    super();
    const problems: string[] = [];
    checkKeys(problems, options, SEQUENCE_CLIENT_KEYS);
    const replyTimeoutMs = options.replyTimeoutMs ?? 30_000;
    const maxJsonBytes = options.maxJsonBytes ?? DEFAULT_DECODE_LIMITS.maxJsonBytes;
    const maxReplyBytes = options.maxReplyBytes ?? 256 * 1024 * 1024;
    checkDelay(problems, 'replyTimeoutMs', replyTimeoutMs, 1);
    checkInteger(problems, 'maxJsonBytes', maxJsonBytes, 0);
    checkInteger(problems, 'maxReplyBytes', maxReplyBytes, 0);
    // Checked by every publish otherwise, which would fail each emit() and send() instead.
    for (const name of ['inlineMaxBytes', 'sequenceMaxBytes'] as const) {
      if (options[name] !== undefined) checkInteger(problems, name, options[name], 0);
    }
    const channelOf = channelOfOption(problems, options.channelOf);
    if (problems.length > 0) throw new SequenceOptionsError('SequenceClient', problems);
    this.settings = {
      replyTimeoutMs,
      channelOf,
      maxJsonBytes,
      maxReplyBytes,
      inlineMaxBytes: options.inlineMaxBytes,
      sequenceMaxBytes: options.sequenceMaxBytes,
    };
  }

  /** @internal The module attaches itself. */
  [ATTACH_RUNTIME](runtime: SequenceRuntime): void {
    this.runtime = runtime;
  }

  /**
   * Resolves once the client is bound to the application's SequenceModule; `status` then says
   * `connected`. `send()` calls it, and `emit()` connects as it does.
   */
  async connect(): Promise<void> {
    this.connected();
    return Promise.resolve();
  }

  /**
   * Waits for the `emit()` sends under way: a message emitted just before the application stops
   * (fire and forget, as a request handler does) is confirmed while the transport and the stores
   * are still open, or its failure reported, rather than dropped when they close or the process
   * exits. All `beforeApplicationShutdown` hooks run before any connection closes.
   */
  async beforeApplicationShutdown(): Promise<void> {
    await this.whenSent();
  }

  /**
   * Waits for the sends under way, then closes the reply channel; `send()` calls still waiting
   * for their reply error with ClientClosedError. `status` then says `disconnected`, until the
   * next `send()` or `emit()` connects the client again.
   */
  async close(): Promise<void> {
    await this.whenSent();
    const replies = this.replies;
    this.replies = undefined;
    for (const [id, request] of this.pending) {
      this.forget(id, request);
      request.callback({ err: new ClientClosedError(request.pattern, id) });
    }
    const subscription = await replies?.catch(() => undefined);
    await subscription?.close().catch((error: unknown) => {
      this.logger.warn(`closing the reply channel failed: ${errorMessage(error)}`);
    });
    this._status$.next('disconnected');
  }

  /** The module's transport. */
  unwrap<T>(): T {
    return this.attached().transport as T;
  }

  override emit<TResult = never, TInput = unknown>(
    pattern: unknown,
    data: TInput,
  ): Observable<TResult> {
    // Refused as Nest's own clients refuse it, and, like any failure, logged when nobody hears.
    const refused =
      pattern === undefined || pattern === null || data === undefined || data === null;
    // Subscribers still listening: a failure that comes when there is none is logged (one who
    // unsubscribed first, a timeout() that fired, would not hear of it either).
    let listening = 0;
    if (refused) destroySource(sourceOf(data));
    const sent = refused
      ? Promise.reject(new InvalidMessageException())
      : this.dispatchEvent({ pattern, data });
    this.sending.add(sent);
    const settled = () => this.sending.delete(sent);
    sent.then(settled, settled);
    sent.catch((error: unknown) => {
      if (listening === 0) {
        this.logger.error(
          `emit to ${this.describe(pattern)} failed and nobody subscribed to its Observable: ` +
            errorMessage(error),
        );
      }
    });
    return new Observable<TResult>((subscriber) => {
      listening++;
      // One value, then complete, as Nest's own clients' emit: `lastValueFrom(client.emit(...))`
      // resolves (an Observable that only completes would reject it with EmptyError).
      sent.then(
        () => {
          subscriber.next(undefined as TResult);
          subscriber.complete();
        },
        (error: unknown) => subscriber.error(error),
      );
      return () => {
        listening--;
      };
    });
  }

  // The type parameters' defaults are ClientProxy.send's own: a caller holding the client as a
  // SequenceClient reads its replies as it would through a ClientProxy.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- ClientProxy.send's defaults
  override send<TResult = any, TInput = any>(pattern: unknown, data: TInput): Observable<TResult> {
    // As ClientProxy.send, but a request that is never published never reads its data: refused
    // (no pattern or data; no SequenceModule, which fails connect()), or unsubscribed before the
    // client connected. A stream given (a file) is then destroyed, or its handle stays open.
    const source = sourceOf(data);
    if (pattern === undefined || pattern === null || data === undefined || data === null) {
      destroySource(source);
      return throwError(() => new InvalidMessageException());
    }
    // Each subscription sends a request, as with Nest's own clients; a stream is read by the
    // first (or destroyed, unsubscribed before it is sent): a second would send what is left.
    const once = readOnce(source);
    let taken = false;
    return new Observable<TResult>((subscriber) => {
      if (once && taken) {
        subscriber.error(
          new TypeError(
            `send() to ${this.describe(pattern)}: its data is read as it is sent, and was sent ` +
              'already (a retry() subscribes again): call send() anew for each request, with a ' +
              'new stream',
          ),
        );
        return;
      }
      taken = true;
      let published = false;
      const request = defer(() => this.connect())
        .pipe(
          mergeMap(
            () =>
              new Observable<TResult>((observer) => {
                published = true;
                return this.publish({ pattern, data }, this.createObserver(observer));
              }),
          ),
        )
        .subscribe(subscriber);
      return () => {
        request.unsubscribe();
        if (!published) destroySource(source);
      };
    });
  }

  protected async dispatchEvent<T = unknown>(packet: ReadPacket): Promise<T> {
    // Refused before it is read: a stream given (a file) is destroyed, or its handle stays open.
    const runtime = checkedBeforeReading(sourceOf(packet.data), () => this.connected());
    const pattern = this.normalizePattern(packet.pattern as string);
    await this.sendTo(runtime, pattern, packet.data, undefined);
    return undefined as T;
  }

  protected publish(packet: ReadPacket, callback: (packet: WritePacket) => void): () => void {
    const pattern = this.normalizePattern(packet.pattern as string);
    const correlationId = randomUUID();
    const request: PendingRequest = {
      pattern,
      callback,
      timer: undefined,
      sending: new AbortController(),
    };
    this.pending.set(correlationId, request);
    const fail = (error: unknown) => {
      if (this.forget(correlationId, request)) callback({ err: error });
    };
    const wait = () => {
      clearTimeout(request.timer);
      request.timer = setTimeout(() => {
        fail(new ReplyTimeoutError(pattern, correlationId, this.settings.replyTimeoutMs));
      }, this.settings.replyTimeoutMs);
      request.timer.unref();
    };
    // Bounds the send too (a broker that never confirms), then again from the confirm: a large
    // request takes its upload's time before the wait for its reply starts.
    wait();
    // Read only once the reply channel is open: a file that cannot be opened meanwhile fails the
    // request, rather than the process.
    holdSourceErrors(sourceOf(packet.data));
    void (async () => {
      const runtime = this.attached();
      const replies = await this.replyChannel(runtime).catch((error: unknown) => {
        // The request is never sent: a stream given (a file) is destroyed, or its handle stays
        // open.
        destroySource(sourceOf(packet.data));
        throw error;
      });
      if (!this.pending.has(correlationId)) {
        // Unsubscribed (or the client closed) while the reply channel opened: nobody waits for
        // an answer, so the request is not sent.
        destroySource(sourceOf(packet.data));
        return;
      }
      await this.sendTo(
        runtime,
        pattern,
        packet.data,
        { [RpcHeader.replyTo]: replies.channel, [RpcHeader.correlationId]: correlationId },
        request.sending.signal,
      );
      if (this.pending.has(correlationId)) wait();
    })().catch(fail);
    return () => void this.forget(correlationId, request);
  }

  /**
   * Stops waiting for the request's reply (it timed out, its caller unsubscribed, the client
   * closes): a request still being sent stops there (a 500 MB study is not uploaded for nobody;
   * what was sent of a sequence stays incomplete and expires), and a reply being read meanwhile
   * is cut short, not read whole for nobody (its store connection held, its bytes in memory).
   * False when it was not waited for any more.
   */
  private forget(correlationId: string, request: PendingRequest): boolean {
    if (!this.pending.delete(correlationId)) return false;
    clearTimeout(request.timer);
    request.sending.abort(
      new Error(
        `nobody waits for the reply to ${request.pattern} (correlation id ${correlationId})`,
      ),
    );
    request.stopReading?.();
    return true;
  }

  /**
   * Publishes `data` for `pattern`: a request with `reply`'s headers, an event without them. An
   * event never names a reply channel, whatever headers its `SequenceRecord` carries (a request's
   * own, passed on with `ctx.getHeaders()`): the server would answer it, and the requester
   * waiting on that channel would take the answer for its own request's. `signal` stops a
   * request's send; an event has none: it is sent whole, whoever listens (see `emit`).
   */
  private async sendTo(
    runtime: SequenceRuntime,
    pattern: string,
    data: unknown,
    reply: Record<string, string> | undefined,
    signal?: AbortSignal,
  ): Promise<void> {
    const encoded = encodePayload(data);
    const out = reply ? encoded : { ...encoded, headers: withoutReplyTo(encoded.headers) };
    await runtime.publish(
      this.settings.channelOf(pattern),
      out.payload,
      {
        ...publishOptionsOf(out, { [RpcHeader.pattern]: pattern, ...reply }),
        inlineMaxBytes: this.settings.inlineMaxBytes,
        sequenceMaxBytes: this.settings.sequenceMaxBytes,
      },
      signal,
    );
  }

  private replyChannel(runtime: SequenceRuntime): Promise<Subscription> {
    if (!this.replies) {
      const opened = runtime.openReplyChannel(
        'SequenceClient.replies',
        (payload, signal) => this.onReply(payload, signal),
        this.settings.replyTimeoutMs,
      );
      if (!opened) {
        return Promise.reject(new ReplyNotSupportedError(runtime.transport.name, 'send()'));
      }
      this.replies = opened;
      opened.catch(() => {
        if (this.replies === opened) this.replies = undefined;
      });
    }
    return this.replies;
  }

  /** `signal`: aborted when reading the reply runs past replyTimeoutMs (the read is cut short). */
  private async onReply(payload: ClaimedPayload, signal: AbortSignal): Promise<void> {
    // A responder of another language may send our headers as byte arrays (see withRpcHeaders).
    const headers = withRpcHeaders(payload.headers, this.runtime?.currentMessage()?.headers);
    const correlationId = headerString(headers, RpcHeader.correlationId);
    const request = correlationId ? this.pending.get(correlationId) : undefined;
    if (!correlationId || !request) {
      // Its request timed out, or was unsubscribed: nobody waits for it.
      this.logger.warn(
        `a reply nobody waits for (correlation id ${correlationId ?? 'none'}) was discarded`,
      );
      return;
    }
    // Its streams closed, the read below fails; the reply is then settled as one nobody waits for.
    request.stopReading = () => payload.close();
    let response: unknown;
    try {
      if (payload.bytes > this.settings.maxReplyBytes) {
        throw new MessageRefusedError(
          'undecodable',
          `a ${payload.bytes}-byte reply to ${request.pattern} is larger than maxReplyBytes ` +
            `(${this.settings.maxReplyBytes})`,
        );
      }
      // Read whole: the reply outlives this call (the caller reads it later).
      response = await decodePayload(
        { ...payload, buffer: () => payload.toBuffer(), stream: () => payload.stream() },
        { streamAboveBytes: Number.POSITIVE_INFINITY, maxJsonBytes: this.settings.maxJsonBytes },
      );
    } catch (error) {
      if (!this.pending.delete(correlationId)) return;
      this.answered(request);
      request.callback({ err: this.readFailure(request, correlationId, error, signal) });
      return;
    }
    // It may have timed out while the reply was read.
    if (!this.pending.delete(correlationId)) return;
    this.answered(request);
    if (headerString(headers, RpcHeader.replyStatus) === 'error') {
      // Nest takes a falsy `err` for no error (and the call would never settle): an error reply
      // without a body still errors.
      const err = response || {
        status: 'error',
        message: `an error reply without a message (body ${JSON.stringify(response) ?? 'empty'})`,
      };
      request.callback({ err });
      return;
    }
    request.callback({ response, isDisposed: true });
  }

  /**
   * A reply settled `request` (no longer pending): a request still being sent stops there. The
   * server answers before the whole request came only to refuse it (a sequence larger than its
   * limit, say), and the rest would be dead-lettered there; what the send then throws goes
   * nowhere, the caller has its answer.
   */
  private answered(request: PendingRequest): void {
    clearTimeout(request.timer);
    request.sending.abort(new Error(`the request to ${request.pattern} was answered`));
  }

  /**
   * What `send()` errors with when its reply came but was not read: a refusal as it is (larger
   * than maxReplyBytes, JSON that does not parse), ReplyTimeoutError when the read ran past
   * replyTimeoutMs (and was cut short), else ReplyUnreadableError around the read's error, never
   * a raw store or stream error.
   */
  private readFailure(
    request: PendingRequest,
    correlationId: string,
    error: unknown,
    signal: AbortSignal,
  ): unknown {
    if (error instanceof MessageRefusedError) return error;
    const { pattern } = request;
    if (signal.aborted) {
      return new ReplyTimeoutError(pattern, correlationId, this.settings.replyTimeoutMs);
    }
    return new ReplyUnreadableError(pattern, correlationId, error);
  }

  /**
   * Resolves once the sends under way are over, however long they take (a send lasts as long as
   * its publish retries, or its stream takes to read), and those started meanwhile too, for at
   * most the module's `shutdownTimeoutMs`: a steady producer (a request handler under load)
   * always has some under way. Those still under way then are left, with a warning: each fails
   * to its subscriber, or is logged, if the transport closes under it.
   */
  private async whenSent(): Promise<void> {
    await Promise.allSettled([...this.sending]);
    const waitMs = this.runtime?.shutdownTimeoutMs ?? 0;
    const deadline = Date.now() + waitMs;
    while (this.sending.size > 0) {
      const sending = Promise.allSettled([...this.sending]);
      if (!(await settlesWithin(sending, deadline - Date.now()))) {
        const count = this.sending.size;
        this.logger.warn(
          `SequenceClient stopped waiting for ${count} emit() ${count === 1 ? 'send' : 'sends'} ` +
            `started as it was closing, after shutdownTimeoutMs (${waitMs} ms)`,
        );
        return;
      }
    }
  }

  /** {@link attached}, the client then `connected` (as Nest's clients connect before a send). */
  private connected(): SequenceRuntime {
    const runtime = this.attached();
    this._status$.next('connected');
    return runtime;
  }

  private attached(): SequenceRuntime {
    if (this.runtime) return this.runtime;
    throw new SequenceOptionsError('SequenceClient', [
      'no SequenceModule in this application: import SequenceModule.forRoot(...) in the ' +
        'application that registers this client with ClientsModule (a client made outside ' +
        'dependency injection, by @Client() or ClientProxyFactory.create(), is never attached)',
    ]);
  }

  private describe(pattern: unknown): string {
    try {
      return this.normalizePattern(pattern as string);
    } catch {
      return String(pattern);
    }
  }
}

/** `headers` without `x-reply-to`. */
function withoutReplyTo(headers: HeaderMap): HeaderMap {
  if (headers[RpcHeader.replyTo] === undefined) return headers;
  const rest = { ...headers };
  delete rest[RpcHeader.replyTo];
  return rest;
}

/**
 * Whether `source` can be read only once: a stream, or records that are a stream, an iterator
 * (a generator) or an async iterable.
 */
function readOnce(source: unknown): boolean {
  if (source instanceof Readable) return true;
  if (!isRecordSource(source)) return false;
  // Any value, in data that is JSON: `{ records: null, total: 0 }`.
  const records: unknown = source.records;
  if (typeof records !== 'object' || records === null) return false;
  return (
    records instanceof Readable ||
    typeof (records as { next?: unknown }).next === 'function' ||
    !(Symbol.iterator in records)
  );
}

/** The payload `data` carries: a SequenceRecord's data, or `data` itself. */
function sourceOf(data: unknown): unknown {
  return data instanceof SequenceRecord ? data.data : data;
}
