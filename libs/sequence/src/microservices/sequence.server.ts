import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { HttpException, Logger } from '@nestjs/common';
import { RpcException, Server, type CustomTransportStrategy } from '@nestjs/microservices';
import { PatternHandler } from '@nestjs/microservices/enums/pattern-handler.enum';
import { RpcParamtype } from '@nestjs/microservices/enums/rpc-paramtype.enum';
import {
  PARAM_ARGS_METADATA,
  PATTERN_HANDLER_METADATA,
  PATTERN_METADATA,
  TRANSPORT_METADATA,
} from '@nestjs/microservices/constants';
import type { ClaimedPayload } from '../claim-check/claimed-payload';
import { brokerDeathReason } from '../core/broker-death';
import { errorMessage, textOf } from '../core/errors/caught';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { jsonText } from '../core/json-text';
import { checkInteger } from '../core/option-checks';
import { handOver, type HandlerContext } from '../kernel/handler-call';
import { handlerRejection } from '../kernel/handler-retry';
import { replyChannelGone } from '../kernel/publish-with-retry';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import { deathReason, splitDeathReason, type RejectionCode } from '../core/errors/rejection-code';
import { carriesFragmentHeaders, SequenceHeader } from '../core/headers';
import { MESSAGE_ID_PATTERN } from '../core/outbox-message';
import { definedOnly, rememberRecent } from '../core/objects';
import { destroySource } from '../core/refused-source';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { ClaimCheckConsumerOptions } from '../options/claim-check.options';
import type { InboundMessage } from '../ports/transport.port';
import { checkKeys, SEQUENCE_SERVER_KEYS } from '../options/option-keys';
import type { ResequencerDefinition } from '../options/resequencer.options';
import type { ResequencedEvent } from '../resequencer/resequenced-event';
import { ReplyNotSupportedError } from './errors/reply-not-supported.error';
import { channelOfOption } from './channel-of';
import { channelsOption } from './channels-option';
import {
  DEFAULT_DECODE_LIMITS,
  decodePayload,
  encodePayload,
  JSON_CONTENT_TYPE,
  publishOptionsOf,
  type IncomingPayload,
  type OutgoingPayload,
} from './payload.codec';
import { headerString, RpcHeader, withRpcHeaders } from './rpc-headers';
import { SequenceContext, type SequenceMessageInfo } from './sequence.context';
import { SequenceRecord } from './sequence.record';
import {
  ATTACH_RUNTIME,
  type ConsumerSpec,
  type ParamsReader,
  type PipelineOutcome,
  type PipelineStage,
  type SequenceRuntime,
} from './sequence-runtime';

/**
 * The transport id of `SequenceServer`: `@EventPattern(pattern, SEQUENCE_TRANSPORT_ID)` keeps a
 * handler to this server in an application that runs several transports.
 */
export const SEQUENCE_TRANSPORT_ID: unique symbol = Symbol.for('nest-sequence:transport');

/** How one channel is consumed. */
export interface SequenceChannelOptions extends ClaimCheckConsumerOptions {
  /**
   * Deliver each key's events strictly in order (a Resequencer): the key and sequence number
   * come from `x-resequence-key` / `x-resequence-seq` unless `key` / `seq` say otherwise.
   * Without it, a channel takes payloads inline, as a Message Sequence or behind a claim ticket.
   * Beside it, the channel takes only `prefetch`, `deadLetterChannel`, `handlerRetry` and
   * `handlerTimeoutMs`, for its resequencer (there or inside `resequence`, not both).
   */
  readonly resequence?: Omit<ResequencerDefinition, 'channel'>;
}

export interface SequenceServerOptions {
  /** Options of the channels, by channel name; a channel not listed takes the module's defaults. */
  readonly channels?: Readonly<Record<string, SequenceChannelOptions>>;
  /**
   * The channel a pattern is consumed from. Several patterns may share one: each message names
   * its pattern in `x-pattern`. @default the pattern itself
   */
  readonly channelOf?: (pattern: string) => string;
  /** Payloads that are not JSON and larger than this reach `@Payload()` as a stream. @default 8 MiB */
  readonly streamAboveBytes?: number;
  /** The largest JSON payload parsed; a larger one is dead-lettered `undecodable`. @default 16 MiB */
  readonly maxJsonBytes?: number;
}

/** A controller method bound to one pattern. */
interface Route {
  readonly pattern: string;
  readonly kind: 'event' | 'message';
  readonly definedBy: string;
  readonly invoke: (...args: unknown[]) => Promise<PipelineOutcome>;
}

/** A message as the server dispatches it, whatever pattern consumed it. */
interface Incoming {
  readonly info: Omit<SequenceMessageInfo, 'pattern' | 'channel' | 'message'>;
  readonly payload: IncomingPayload;
}

const PARAMS: ParamsReader = {
  exchangeKeyForValue(type, data, args) {
    if (type === (RpcParamtype.PAYLOAD as number)) {
      // As Nest's RpcParamsFactory: `@Payload('sku')` of a payload that is not an object (a
      // string, a number) is undefined, not the payload itself.
      const payload = args[0] as Record<PropertyKey, unknown> | null | undefined;
      return data ? payload?.[data as PropertyKey] : payload;
    }
    if (type === (RpcParamtype.CONTEXT as number)) return args[1];
    return undefined;
  },
};

/**
 * A `@nestjs/microservices` transport strategy over the `SequenceModule` of the application:
 * `@EventPattern(channel)` handlers receive payloads sent inline, as a Message Sequence
 * (reassembled, verified) or behind a claim ticket (resolved, verified), or each key's events in
 * order on channels configured with `resequence`, through Nest's guards, interceptors, pipes and
 * exception filters. `@MessagePattern` handlers answer `SequenceClient.send()`.
 *
 * No message is dropped unseen: one whose pattern nothing handles is dead-lettered `no-handler`,
 * one that cannot be decoded `undecodable`, one a guard refuses `forbidden`, one a pipe refuses
 * `invalid-payload` (not retried, whatever an exception filter makes of the refusal); a handler
 * that throws is retried per `handlerRetry`, then the message is dead-lettered with its error (as
 * the exception filters answered it).
 *
 * @example
 * const app = await NestFactory.createMicroservice(AppModule, { strategy: new SequenceServer() });
 * await app.listen();
 */
export class SequenceServer extends Server implements CustomTransportStrategy {
  /** Scopes handlers to this transport: `@EventPattern(pattern, SEQUENCE_TRANSPORT_ID)`. */
  override readonly transportId = SEQUENCE_TRANSPORT_ID;
  private runtime: SequenceRuntime | undefined;
  /** The handlers of a delivery that succeeded, by the delivery (see `dispatch`'s `source`). */
  private readonly completed = new WeakMap<object, Set<Route>>();
  /** The latest requests answered, by {@link answeredKey}, oldest first (see `answerRefused`). */
  private readonly answered = new Set<string>();
  /** The listen under way or done: whether it consumes (see `SequenceRuntime.consume`). */
  private started: Promise<boolean> | undefined;
  private specs: ConsumerSpec[] | undefined;
  private readonly options: Required<Omit<SequenceServerOptions, 'channels'>> & {
    readonly channels: Readonly<Record<string, SequenceChannelOptions>>;
  };

  constructor(options: SequenceServerOptions = {}) {
    super();
    const problems: string[] = [];
    checkKeys(problems, options, SEQUENCE_SERVER_KEYS);
    const streamAboveBytes = options.streamAboveBytes ?? DEFAULT_DECODE_LIMITS.streamAboveBytes;
    const maxJsonBytes = options.maxJsonBytes ?? DEFAULT_DECODE_LIMITS.maxJsonBytes;
    checkInteger(problems, 'streamAboveBytes', streamAboveBytes, 0);
    checkInteger(problems, 'maxJsonBytes', maxJsonBytes, 0);
    const channelOf = channelOfOption(problems, options.channelOf);
    const channels = channelsOption(problems, options.channels);
    if (problems.length > 0) throw new SequenceOptionsError('SequenceServer', problems);
    this.options = {
      channels,
      channelOf,
      streamAboveBytes,
      maxJsonBytes,
    };
  }

  /** @internal The module attaches itself. */
  [ATTACH_RUNTIME](runtime: SequenceRuntime): void {
    this.runtime = runtime;
  }

  /**
   * Consumes the channels of the patterns. `status` then says `connected`, or `disconnected`
   * when the listen failed or the module's shutdown began (nothing consumes).
   */
  listen(callback: (error?: unknown) => void): void {
    const started = (this.started ??= this.start());
    started.then(
      (consuming) => {
        // Closed meanwhile: it said so then.
        if (this.started === started) this._status$.next(consuming ? 'connected' : 'disconnected');
        callback();
      },
      (error: unknown) => {
        if (this.started === started) this.started = undefined;
        this._status$.next('disconnected');
        callback(error);
      },
    );
  }

  /**
   * Stops nothing itself: the module drains and closes the subscriptions at shutdown. `status`
   * says `disconnected` from here.
   */
  close(): void {
    this.started = undefined;
    this._status$.next('disconnected');
  }

  /** Unsupported: `status` says whether it consumes; the module's metrics and health the rest. */
  on(): never {
    throw new Error('SequenceServer emits no events: use the module metrics and health indicators');
  }

  /** The module's transport. */
  unwrap<T>(): T {
    return this.attached('unwrap()').transport as T;
  }

  private attached(what: string): SequenceRuntime {
    if (this.runtime) return this.runtime;
    throw new SequenceOptionsError(`SequenceServer ${what}`, [
      'no SequenceModule in this application: import SequenceModule.forRoot(...) in the module ' +
        'given to NestFactory.createMicroservice (or, for a hybrid app, to NestFactory.create)',
    ]);
  }

  private async start(): Promise<boolean> {
    const runtime = this.attached('listen()');
    // Built once: a listen() tried again after a failed subscribe binds the same consumers (a
    // resequenced channel's resequencer is defined once).
    this.specs ??= this.consumers(runtime);
    return runtime.consume(this.specs);
  }

  /** One consumer per channel, for the patterns Nest added to this server; throws for bad ones. */
  private consumers(runtime: SequenceRuntime): ConsumerSpec[] {
    const routes = this.routes(runtime);
    const byChannel = new Map<string, Map<string, Route[]>>();
    for (const route of routes) {
      const channel = this.options.channelOf(route.pattern);
      if (typeof channel !== 'string' || channel.length === 0) {
        throw new SequenceOptionsError('SequenceServer', [
          `channelOf(${JSON.stringify(route.pattern)}) returned no channel name`,
        ]);
      }
      const patterns = byChannel.get(channel) ?? new Map<string, Route[]>();
      patterns.set(route.pattern, [...(patterns.get(route.pattern) ?? []), route]);
      byChannel.set(channel, patterns);
    }
    const problems: string[] = [];
    for (const patterns of byChannel.values()) {
      for (const [pattern, each] of patterns) {
        const replying = each.filter((route) => route.kind === 'message');
        if (replying.length > 0 && each.length > 1) {
          problems.push(
            `pattern ${JSON.stringify(pattern)} has ${each.length} handlers ` +
              `(${each.map((route) => route.definedBy).join(', ')}); a @MessagePattern must be ` +
              "its pattern's only handler: one request gets one reply",
          );
        }
      }
    }
    const unknown = Object.keys(this.options.channels).filter((channel) => !byChannel.has(channel));
    if (unknown.length > 0) {
      problems.push(
        `channels: no handler consumes ${unknown.join(', ')} ` +
          `(consumed: ${[...byChannel.keys()].join(', ') || 'none'})`,
      );
    }
    if (problems.length > 0) throw new SequenceOptionsError('SequenceServer', problems);
    const replying = routes.find((route) => route.kind === 'message');
    const { transport } = runtime;
    if (replying && !(transport.openReplyChannel && transport.isReplyChannel)) {
      throw new ReplyNotSupportedError(transport.name, `@MessagePattern on ${replying.definedBy}`);
    }
    return [...byChannel].map(([channel, patterns]) => this.consumerOf(channel, patterns, runtime));
  }

  /**
   * The controller methods Nest added to this server, each wrapped in Nest's pipeline; throws
   * for one that cannot be served (a request-scoped controller), rather than leave its pattern
   * unconsumed.
   */
  private routes(runtime: SequenceRuntime): Route[] {
    const ours = this.getHandlers();
    const routes: Route[] = [];
    const unserved: string[] = [];
    /** Patterns of this server a controller method was found for, served or not. */
    const found = new Set<string>();
    for (const target of runtime.methodsWith(PATTERN_METADATA)) {
      const transport = Reflect.getMetadata(TRANSPORT_METADATA, target.method) as unknown;
      if (transport !== undefined && transport !== SEQUENCE_TRANSPORT_ID) continue;
      const patterns = (Reflect.getMetadata(PATTERN_METADATA, target.method) ?? []) as unknown[];
      const type = Reflect.getMetadata(PATTERN_HANDLER_METADATA, target.method) as unknown;
      const definedBy = `${target.className}.${target.methodName}`;
      for (const given of patterns) {
        const pattern = this.normalizePattern(given as string);
        if (!ours.has(pattern)) continue;
        found.add(pattern);
        if (!target.singleton) {
          unserved.push(
            `${definedBy} (pattern ${JSON.stringify(pattern)}): its controller is request-scoped ` +
              'or transient (or depends on such a provider); SequenceServer serves singleton ' +
              'controllers only',
          );
          continue;
        }
        routes.push({
          pattern,
          kind: type === PatternHandler.EVENT ? 'event' : 'message',
          definedBy,
          invoke: runtime.pipeline(target, PARAM_ARGS_METADATA, PARAMS),
        });
      }
    }
    for (const pattern of ours.keys()) {
      if (!found.has(pattern)) {
        unserved.push(`pattern ${JSON.stringify(pattern)}: no controller method found for it`);
      }
    }
    if (unserved.length > 0) throw new SequenceOptionsError('SequenceServer', unserved);
    return routes;
  }

  private consumerOf(
    channel: string,
    patterns: ReadonlyMap<string, Route[]>,
    runtime: SequenceRuntime,
  ): ConsumerSpec {
    const definedBy = [...patterns.values()]
      .flat()
      .map((route) => route.definedBy)
      .join(', ');
    const { resequence, ...consumer } = this.options.channels[channel] ?? {};
    const refused = (message: InboundMessage, reason: string) =>
      this.answerRefused(definedBy, message, reason, runtime);
    if (resequence) {
      return {
        kind: 'ordered',
        definedBy,
        refused,
        // Beside resequence only the options its resequencer takes too (channelsOption); one
        // left undefined inside it (from a config) does not unset the one beside it.
        definition: { ...consumer, ...definedOnly(resequence), gap: resequence.gap, channel },
        handler: (event, call) =>
          this.dispatch(channel, patterns, event, fromEvent(event), runtime, call),
      };
    }
    return {
      kind: 'payloads',
      definedBy,
      refused,
      options: { ...consumer, channel },
      // A sequence's payload object is made anew for each call of a retry; the message whose
      // delivery completed it is the same.
      handler: (payload, call) => {
        const message = runtime.currentMessage();
        return this.dispatch(
          channel,
          patterns,
          message ?? payload,
          fromClaimed(payload, message),
          runtime,
          call,
        );
      },
    };
  }

  /**
   * The pattern a message of `channel` is for: its `x-pattern`, except on a dead letter whose
   * `x-pattern` is still that of the message it was, a pattern of another channel: then the
   * channel's own, so that `@EventPattern('orders.dlq')` receives it.
   */
  private patternOf(
    headers: Readonly<Record<string, unknown>>,
    transportHeaders: Readonly<Record<string, unknown>> | undefined,
    channel: string,
  ): string {
    const named = headerString(headers, RpcHeader.pattern);
    if (named === undefined) return channel;
    if (!isDeadLetter(headers, transportHeaders)) return named;
    try {
      return this.options.channelOf(named) === channel ? named : channel;
    } catch {
      return named;
    }
  }

  /**
   * Runs the handlers of the message's pattern; throws what fails it (see the class comment).
   * `source` is the same object on every call of one delivery's `handlerRetry`: handlers of the
   * pattern that already succeeded for it are not run again (a redelivery runs them all).
   * `call` is the kernel's: once its signal is aborted (the call ran past `handlerTimeoutMs`),
   * what the call's handlers return is ignored — no reply, nothing counted done. A
   * `@MessagePattern`'s reply is handed over to be sent after the call, outside its time limit;
   * should the retries end on a call of it that failed (ran past the limit), the caller gets the
   * dead letter's reason as an error reply.
   */
  private async dispatch(
    channel: string,
    patterns: ReadonlyMap<string, Route[]>,
    source: object,
    incoming: Incoming,
    runtime: SequenceRuntime,
    call: HandlerContext,
  ): Promise<void> {
    const { signal } = call;
    const { headers } = incoming.info;
    const transportHeaders = runtime.currentMessage()?.headers;
    const pattern = this.patternOf(headers, transportHeaders, channel);
    const routes = patterns.get(pattern);
    // A dead letter keeps its request's reply headers, but is never answered: its caller had
    // its answer (or timed out) when it was dead-lettered.
    const request: Request = isDeadLetter(headers, transportHeaders)
      ? { ok: false, event: true, problem: 'it is a dead letter, which is never answered' }
      : requestOf(headers, runtime);
    if (!routes) {
      const refusal = new MessageRefusedError(
        'no-handler',
        `no @EventPattern or @MessagePattern of this application handles pattern ` +
          `${JSON.stringify(pattern)} on channel ${channel}`,
      );
      // A caller waiting for a reply learns it as the request is dead-lettered, rather than at
      // its timeout; the refusal ends the retries at once. Sent outside the call's time limit,
      // as any reply: a slow publish must not turn the refusal into a handler-timeout.
      if (request.ok) {
        handOver(call, {
          onGiveUp: () => this.sendReply(request, pattern, failure(refusal), runtime),
        });
      }
      throw refusal;
    }
    if (request.ok && !routes.some((route) => route.kind === 'message')) {
      // Nothing will reply: the caller learns it once the event handlers have run (as for an
      // emit()), or their retries ended, rather than at its timeout; sent outside the call's
      // time limit, as any reply.
      const refusal = new MessageRefusedError(
        'no-handler',
        `no @MessagePattern of this application answers pattern ${JSON.stringify(pattern)} on ` +
          `channel ${channel}; its @EventPattern handlers run as for an emit()`,
      );
      const answer = () => this.sendReply(request, pattern, failure(refusal), runtime);
      handOver(call, { afterCall: answer, onGiveUp: answer });
    }
    const done = this.completed.get(source) ?? new Set<Route>();
    this.completed.set(source, done);
    for (const route of routes) {
      if (done.has(route)) continue;
      if (route.kind === 'message' && !request.ok && request.event) {
        // Nothing is wrong with the message: no handler of the application takes it as an event.
        throw new MessageRefusedError(
          'no-handler',
          `only a request handler (@MessagePattern ${route.definedBy}) handles pattern ` +
            `${JSON.stringify(pattern)} on channel ${channel}, and the message is not a ` +
            `request: ${request.problem}`,
        );
      }
      if (route.kind === 'message' && !request.ok) {
        throw new MessageRefusedError(
          'undecodable',
          `a request for ${pattern}: ${request.problem}`,
        );
      }
      if (route.kind === 'message' && request.ok) {
        // A call past its limit may never return: when the retries end on it, the caller learns
        // why at once, as the message is dead-lettered, rather than at its replyTimeoutMs.
        handOver(call, {
          onGiveUp: (given) => {
            const what = given.error instanceof HandlerTimeoutError ? given.error.subject : pattern;
            const { code, detail } = handlerRejection(what, given);
            const error = new Error(deathReason(code, detail));
            return this.sendReply(request, route.definedBy, failure(error), runtime);
          },
        });
      }
      const context = new SequenceContext({
        ...incoming.info,
        channel,
        pattern,
        message: runtime.currentMessage(),
        signal,
      });
      let outcome: PipelineOutcome;
      try {
        const data = await decodePayload(incoming.payload, this.options);
        outcome = await route.invoke(data, context);
      } catch (error) {
        outcome = failure(error, 'before-pipes');
      }
      // Abandoned: a later call of the retry (or a redelivery) answers for the message.
      if (signal.aborted) {
        if (outcome.ok) destroyReturned(outcome.value);
        return;
      }
      if (route.kind === 'message' && request.ok) {
        // The request is done either way: the caller gets the result, or the error. The reply
        // goes out once the call has returned, outside its time limit (a large reply's publish
        // must not make a handler that returned in time run again); the message is settled
        // after it. The pattern's only handler: nothing runs after it.
        handOver(call, {
          afterCall: async () => {
            await this.sendReply(request, route.definedBy, outcome, runtime);
            done.add(route);
          },
          // The message goes back (its payload could not be read): the delivery that reads it
          // answers.
          dropped: () => {
            if (outcome.ok) destroyReturned(outcome.value);
          },
        });
        return;
      }
      if (outcome.ok) {
        // An event handler's result is never sent: a stream it returned would stay open.
        destroyReturned(outcome.value);
        done.add(route);
        continue;
      }
      const refusal = refusalOf(outcome);
      if (refusal) throw refusal;
      throw describedError(outcome.filtered);
    }
  }

  /**
   * A message the consumer dead-letters: a request that no handler answered (its payload could
   * not be had, its sequence was refused) gets the dead letter's reason as its error at once,
   * rather than its caller waiting out `replyTimeoutMs`. A fragment is answered only for a reason
   * that ends its sequence: one refused for its own body (a bad CRC-32) may have a good copy
   * that completes it. Each request is answered once: a refused sequence's fragments are all
   * dead-lettered, and a request its handlers answered is not answered again.
   */
  private async answerRefused(
    definedBy: string,
    message: InboundMessage,
    reason: string,
    runtime: SequenceRuntime,
  ): Promise<void> {
    const headers: Readonly<Record<string, unknown>> = message.headers ?? {};
    if (isDeadLetter(headers, undefined)) return; // a dead letter, read back
    if (carriesFragmentHeaders(headers) && !SEQUENCE_ENDING.has(splitDeathReason(reason).code))
      return;
    const request = requestOf(headers, runtime);
    if (!request.ok || this.answered.has(answeredKey(request))) return;
    await this.sendReply(request, definedBy, failure(new Error(reason)), runtime);
  }

  /** Notes a request as answered, keeping the latest {@link ANSWERED_KEPT}. */
  private noteAnswered(request: Extract<Request, { ok: true }>): void {
    rememberRecent(this.answered, answeredKey(request), ANSWERED_KEPT);
  }

  /**
   * Sends a `@MessagePattern`'s result (or its error) to the requester, by the same size rule as
   * any message. A result or an error that cannot be encoded goes back as an error saying so; so
   * does one that cannot be sent (a stream that fails as it is read, a payload store that refuses
   * it), so that the caller learns why at once rather than at its `replyTimeoutMs`. A stream the
   * result is (a `SequenceRecord`'s included) is destroyed once done with, sent or not.
   */
  private async sendReply(
    request: Extract<Request, { ok: true }>,
    definedBy: string,
    outcome: PipelineOutcome,
    runtime: SequenceRuntime,
  ): Promise<void> {
    this.noteAnswered(request);
    try {
      await this.publishOutcome(request, definedBy, outcome, runtime);
    } finally {
      // Read to its end when the reply went out; else (its publish failed, an error reply went
      // instead) what is left of it would hold its file or socket open.
      if (outcome.ok) destroyReturned(outcome.value);
    }
  }

  /** {@link sendReply}'s publish: the result, or the error that replaces it. */
  private async publishOutcome(
    request: Extract<Request, { ok: true }>,
    definedBy: string,
    outcome: PipelineOutcome,
    runtime: SequenceRuntime,
  ): Promise<void> {
    let out: OutgoingPayload;
    let failed = !outcome.ok;
    // Whether a short error saying why may take its place should the reply not be sent: not when
    // it is that short error already.
    let replaceable = true;
    try {
      out = outcome.ok ? encodePayload(outcome.value) : errorReply(replyError(outcome));
    } catch (error) {
      failed = true;
      replaceable = false;
      out = errorReply(errorText(`the reply cannot be encoded: ${errorMessage(error)}`));
    }
    let error = await publishReply(request, out, failed, runtime);
    // Its reply channel closed (the requester stopped), an error reply would be refused too.
    if (
      error !== undefined &&
      replaceable &&
      !replyChannelClosed(error, request.replyTo, runtime)
    ) {
      const unsent = errorMessage(error);
      error = await publishReply(
        request,
        errorReply(errorText(`the reply could not be sent: ${unsent}`)),
        true,
        runtime,
      );
      if (error !== undefined) error = `${unsent}; then its error reply: ${errorMessage(error)}`;
    }
    if (error !== undefined) {
      // The requester is gone (its reply channel with it), or the broker refused: the request
      // was handled; its caller times out.
      new Logger('SequenceServer').warn(
        `${definedBy}: the reply to ${request.correlationId} could not be sent to ` +
          `${request.replyTo}: ${errorMessage(error)}`,
      );
    }
  }
}

/** How many answered requests a server remembers, not to answer a refused one twice. */
const ANSWERED_KEPT = 10_000;

/**
 * A request among those answered: its reply channel with its correlation id, since each
 * requester picks its ids alone (two may both send an id 1). Hashed, so that each key stays the
 * same small size whatever the length of the reply channel's name a sender gives.
 */
function answeredKey(request: {
  readonly replyTo: string;
  readonly correlationId: string;
}): string {
  return createHash('sha256')
    .update(JSON.stringify([request.replyTo, request.correlationId]))
    .digest('base64');
}

/**
 * Why a fragment is dead-lettered when its whole sequence never completes: the sequence was
 * refused, expired or failed its check, or the fragment's body cannot be had (its store, its
 * ticket) or taken (every copy of it is as large), nor its headers kept, nor its key (every
 * fragment carries the same).
 */
const SEQUENCE_ENDING: ReadonlySet<string> = new Set<RejectionCode>([
  'unsupported-version',
  'fragment-too-large',
  'headers-too-large',
  'integrity-mismatch',
  'invalid-resequence-event',
  'sequence-too-large',
  'too-many-fragments',
  'sequence-rejected',
  'sequence-expired',
  'store-unavailable',
  'claim-ticket-invalid',
  'wrong-audience',
  'unknown-payload-store',
  'claim-check-not-found',
]);

/**
 * Destroys a stream a handler returned (a `SequenceRecord`'s included) once it is not to be read,
 * or read no more: a file's handle, a socket, would stay open.
 */
function destroyReturned(value: unknown): void {
  destroySource(value instanceof SequenceRecord ? value.data : value);
}

/**
 * An error reply: `body` as JSON, whatever it is, as Nest's transporters send an error (a
 * Buffer's bytes or a stream would not read back as the error).
 * @throws TypeError when JSON cannot carry `body` (see jsonText)
 */
function errorReply(body: unknown): OutgoingPayload {
  const payload = Buffer.from(jsonText(body) ?? 'null', 'utf8');
  return { payload, contentType: JSON_CONTENT_TYPE, bytes: payload.length, headers: {} };
}

/** The error Nest gives for a text: what `send()` errors with. */
function errorText(message: unknown): { status: 'error'; message: unknown } {
  return { status: 'error', message };
}

/** Publishes a reply to the requester; resolves with what failed it, if anything. */
async function publishReply(
  request: Extract<Request, { ok: true }>,
  out: OutgoingPayload,
  failed: boolean,
  runtime: SequenceRuntime,
): Promise<unknown> {
  try {
    await runtime.publish(
      request.replyTo,
      out.payload,
      publishOptionsOf(out, {
        [RpcHeader.correlationId]: request.correlationId,
        [RpcHeader.replyStatus]: failed ? 'error' : 'ok',
      }),
    );
    return undefined;
  } catch (error) {
    return error ?? new Error('the publish failed without an error');
  }
}

/**
 * Whether a reply's publish failed because its reply channel is closed, by `error` or what caused
 * it (`ClaimCheckPublishError`, `SequencePublishError`): nobody is left to tell.
 */
function replyChannelClosed(error: unknown, replyTo: string, runtime: SequenceRuntime): boolean {
  const seen = new Set<unknown>();
  for (let cause = error; cause instanceof Error && !seen.has(cause); cause = cause.cause) {
    if (replyChannelGone(runtime.transport, replyTo, cause)) return true;
    seen.add(cause);
  }
  return false;
}

/**
 * What a message says of the reply it expects. Not a request, `problem` says why: `event` when it
 * is no request at all (an `emit()`, a dead letter), else its reply headers are not usable.
 */
type Request =
  | { readonly ok: true; readonly replyTo: string; readonly correlationId: string }
  | { readonly ok: false; readonly problem: string; readonly event?: true };

/**
 * Whether the message is a dead letter read back (its payload's or its message's headers say):
 * one the module dead-lettered (`x-death-reason`), or one the broker dead-lettered itself.
 */
function isDeadLetter(
  headers: Readonly<Record<string, unknown>>,
  transportHeaders: Readonly<Record<string, unknown>> | undefined,
): boolean {
  return [headers, transportHeaders ?? {}].some(
    (each) =>
      each[SequenceHeader.deathReason] !== undefined || brokerDeathReason(each) !== undefined,
  );
}

function requestOf(headers: Readonly<Record<string, unknown>>, runtime: SequenceRuntime): Request {
  const replyTo = headerString(headers, RpcHeader.replyTo);
  const correlationId = headerString(headers, RpcHeader.correlationId);
  if (headers[RpcHeader.replyTo] === undefined && headers[RpcHeader.correlationId] === undefined) {
    return {
      ok: false,
      event: true,
      problem:
        `it is an event (an emit()), with neither ${RpcHeader.replyTo} nor ` +
        `${RpcHeader.correlationId}: send a request with SequenceClient.send()`,
    };
  }
  if (!replyTo || !correlationId) {
    return {
      ok: false,
      problem:
        `it has no ${RpcHeader.replyTo} and ${RpcHeader.correlationId}: ` +
        'send it with SequenceClient.send()',
    };
  }
  // SequenceClient sends a UUID. Bounded as a message id is, whatever a sender puts there: the
  // id goes back in the reply's headers and into log lines.
  if (!MESSAGE_ID_PATTERN.test(correlationId)) {
    return {
      ok: false,
      problem:
        `its ${RpcHeader.correlationId} is not 1 to 200 characters without control characters ` +
        `(${correlationId.length} characters)`,
    };
  }
  if (runtime.transport.isReplyChannel?.(replyTo) !== true) {
    return {
      ok: false,
      problem: `${RpcHeader.replyTo} ${JSON.stringify(replyTo.slice(0, 200))} is not a reply channel of the ${runtime.transport.name} transport`,
    };
  }
  return { ok: true, replyTo, correlationId };
}

function failure(error: unknown, stage: PipelineStage = 'handler'): PipelineOutcome {
  return { ok: false, error, stage, filtered: error };
}

/**
 * A refusal for good: the handler refused the message, a pipe refused its payload (an
 * HttpException or RpcException thrown while the pipes run), or a guard refused it (it returned
 * false, or threw an RpcException or a 401 or 403; or an interceptor threw a 401 or 403 before
 * the pipes). Judged by what was thrown, whatever an exception filter made of it.
 */
function refusalOf(outcome: {
  error: unknown;
  stage: PipelineStage;
}): MessageRefusedError | undefined {
  const { error, stage } = outcome;
  if (error instanceof MessageRefusedError) return error;
  if (stage === 'pipes' && (error instanceof HttpException || error instanceof RpcException)) {
    // What a validating pipe throws; any other error of a pipe (a lookup that failed) is retried.
    return new MessageRefusedError('invalid-payload', pipeMessages(error), { cause: error });
  }
  // A guard's refusal: an RpcException, or a 401 or 403, from a guard (a guard returning false
  // throws Nest's 403) or from an interceptor before the pipes. Anything else is retried: a
  // guard's lookup that failed, a 429 of a rate limit, a 503 of an auth service away.
  const refused =
    (stage === 'guards' && error instanceof RpcException) ||
    ((stage === 'guards' || stage === 'before-pipes') &&
      error instanceof HttpException &&
      (error.getStatus() === 401 || error.getStatus() === 403));
  if (!refused) return undefined;
  const text = error instanceof RpcException ? rpcText(error) : (error as Error).message;
  return new MessageRefusedError('forbidden', `a guard refused the message: ${text}`, {
    cause: error,
  });
}

/** What a pipe said: a ValidationPipe's list of messages, an RpcException's error. */
function pipeMessages(error: unknown): string {
  if (error instanceof HttpException) {
    const response = error.getResponse();
    const message =
      typeof response === 'object' && response !== null
        ? (response as { message?: unknown }).message
        : response;
    if (Array.isArray(message)) return message.map(String).join('; ');
    return typeof message === 'string' ? message : error.message;
  }
  return rpcText(error);
}

/** An error's text: an RpcException's error (a string, or an object as JSON), else its message. */
function rpcText(error: unknown): string {
  if (error instanceof RpcException) {
    const inner = error.getError();
    if (typeof inner === 'string') return inner;
    try {
      return JSON.stringify(inner);
    } catch {
      return error.message;
    }
  }
  return errorMessage(error);
}

/**
 * The error to retry with, whose message says what went wrong: an RpcException's own error, or
 * what an exception filter's Observable errored with (often a plain object), as JSON.
 */
function describedError(error: unknown): unknown {
  if (error instanceof RpcException) return new Error(rpcText(error), { cause: error });
  if (error instanceof Error) return error;
  // A thrown text is the message itself, as send() answers it: not quoted as JSON.
  if (typeof error === 'string') return new Error(error, { cause: error });
  let text: string;
  try {
    text = JSON.stringify(error) ?? textOf(error);
  } catch {
    text = textOf(error);
  }
  return new Error(text, { cause: error });
}

/**
 * What `send()` errors with, as with Nest's `BaseRpcExceptionFilter`: an RpcException's error as
 * it is when it is an object, else `{ status: 'error', message }` with it; what an exception
 * filter errors with (or a handler throws) as it is when it is an object, a text as `message`.
 * An Error, thrown or an RpcException's, gives its message (JSON would send it as `{}`; Nest
 * sends "Internal server error" for one thrown); a refusal its dead letter's reason.
 */
function replyError(outcome: Extract<PipelineOutcome, { ok: false }>): unknown {
  const refusal = refusalOf(outcome);
  if (refusal) return errorText(deathReason(refusal.code, refusal.message));
  const { filtered } = outcome;
  const error = filtered instanceof RpcException ? filtered.getError() : filtered;
  if (error instanceof Error) return errorText(error.message);
  if (typeof error === 'object' && error !== null) return error;
  if (filtered instanceof RpcException) return errorText(error);
  return errorText(typeof error === 'string' ? error : textOf(error));
}

/** `message`: the transport's, whose headers may carry ours as bytes (see withRpcHeaders). */
function fromClaimed(payload: ClaimedPayload, message: InboundMessage | undefined): Incoming {
  return {
    info: {
      headers: withRpcHeaders(payload.headers, message?.headers),
      via: payload.via,
      bytes: payload.bytes,
      fragments: payload.fragments,
      sequenceId: payload.sequenceId,
      sha256: payload.sha256 || undefined,
      contentType: payload.contentType,
    },
    payload: {
      bytes: payload.bytes,
      contentType: payload.contentType,
      buffer: () => payload.toBuffer(),
      stream: () => payload.stream(),
    },
  };
}

function fromEvent(event: ResequencedEvent): Incoming {
  const contentType = headerString(event.headers, 'content-type');
  return {
    info: {
      headers: event.headers,
      via: 'resequenced',
      bytes: event.body.length,
      fragments: 1,
      contentType,
      key: event.key,
      seq: event.seq,
    },
    payload: {
      bytes: event.body.length,
      contentType,
      buffer: () => Promise.resolve(event.body),
      stream: () => Readable.from([event.body]),
    },
  };
}
