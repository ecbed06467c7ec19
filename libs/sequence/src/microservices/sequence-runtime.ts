import type { HandlerContext } from '../kernel/handler-call';
import type { ClaimPublishOptions, ClaimPublishReceipt } from '../claim-check/claim-check.service';
import type { ClaimedPayload } from '../claim-check/claimed-payload';
import type { ClaimCheckHandlerOptions } from '../discovery/claim-check.decorator';
import type { RecordSource } from '../core/payload-source';
import type { ResequencerDefinition } from '../options/resequencer.options';
import type { ResequencedEvent } from '../resequencer/resequenced-event';
import type { InboundMessage, Subscription, Transport } from '../ports/transport.port';
import type { Readable } from 'node:stream';

/** A controller method, as the microservices integration invokes it. */
export interface ControllerMethod {
  readonly instance: object;
  readonly className: string;
  readonly methodName: string;
  readonly method: (...args: unknown[]) => unknown;
  /**
   * False for a request-scoped or transient controller (or one that depends on such a provider):
   * there is no one instance to call, so it cannot be served.
   */
  readonly singleton: boolean;
}

/**
 * Where in Nest's pipeline a call stopped: a guard, an interceptor before the pipes (or the
 * decoding before the pipeline), a pipe, the method.
 */
export type PipelineStage = 'guards' | 'before-pipes' | 'pipes' | 'handler';

/** Reads a parameter's value from the call's arguments, as Nest's `ParamsFactory` does. */
export interface ParamsReader {
  exchangeKeyForValue(type: number, data: unknown, args: unknown[]): unknown;
}

/**
 * How a call through Nest's pipeline ended. A failed call has `error`, thrown at `stage` before
 * the exception filters ran, and `filtered`: what they made of it (what they threw, or what their
 * Observable errored with; `error` itself when none caught it).
 */
export type PipelineOutcome =
  | { readonly ok: true; readonly value: unknown }
  | {
      readonly ok: false;
      readonly error: unknown;
      readonly stage: PipelineStage;
      readonly filtered: unknown;
    };

/**
 * A message of the channel the consumer dead-letters as it takes it, with the dead letter's
 * `x-death-reason`; awaited before the message is settled. Never throws.
 */
export type RefusedHook = (message: InboundMessage, reason: string) => Promise<void>;

/** One channel a microservice consumes. */
export type ConsumerSpec =
  | {
      readonly kind: 'payloads';
      readonly definedBy: string;
      readonly refused?: RefusedHook;
      /** `@ClaimCheck` options, the channel included: inline, sequenced or ticketed payloads. */
      readonly options: ClaimCheckHandlerOptions;
      readonly handler: (payload: ClaimedPayload, context: HandlerContext) => unknown;
    }
  | {
      readonly kind: 'ordered';
      readonly definedBy: string;
      readonly refused?: RefusedHook;
      readonly definition: ResequencerDefinition;
      readonly handler: (event: ResequencedEvent, context: HandlerContext) => unknown;
    };

/**
 * What a `SequenceModule` offers the `@nestjs/microservices` integration (`nest-sequence/
 * microservices`): its transport, its consumers, its auto publish, and Nest's pipeline around
 * controller methods. The module attaches it to every `SequenceServer` and `SequenceClient` of the
 * application.
 */
export interface SequenceRuntime {
  readonly transport: Transport;
  /** The module's `shutdownTimeoutMs`. */
  readonly shutdownTimeoutMs: number;
  /** Controller methods (inherited ones included) whose metadata has `metadataKey`. */
  methodsWith(metadataKey: string): ControllerMethod[];
  /**
   * Nest's pipeline (guards, interceptors, pipes, exception filters) around `target`, for the
   * `rpc` context: the returned function takes the call's arguments. An Observable the method or
   * an exception filter returns is awaited to its last value (its error is the call's). An
   * exception filter that answers with a value makes the call a success.
   */
  pipeline(
    target: ControllerMethod,
    paramsMetadataKey: string,
    params: ParamsReader,
  ): (...args: unknown[]) => Promise<PipelineOutcome>;
  /** The transport's message being handled in this async context, if any. */
  currentMessage(): InboundMessage | undefined;
  /**
   * Consumes the channels: registered at once (a channel another handler consumes is refused),
   * opened now when the module is running, else with the others at bootstrap. Once the module's
   * shutdown began, nothing is consumed, with a warning.
   * @returns `false` when nothing is consumed because the shutdown began
   */
  consume(specs: readonly ConsumerSpec[]): Promise<boolean>;
  /**
   * `ClaimCheckService.publish` with `mode: 'auto'`: inline, a Message Sequence or a ticket;
   * stopped once `signal` aborts (a request nobody waits for any more).
   */
  publish(
    channel: string,
    payload: Buffer | Readable | RecordSource,
    options: ClaimPublishOptions,
    signal?: AbortSignal,
  ): Promise<ClaimPublishReceipt>;
  /**
   * A private reply channel (the transport's `openReplyChannel`) whose payloads, inline,
   * sequenced or ticketed, reach `handler`; undefined when the transport cannot route replies.
   * Each reply is read once, within `readTimeoutMs` (the client's `replyTimeoutMs`), not under
   * the module's `handlerTimeoutMs` and `handlerRetry`: `signal` is aborted when its call runs
   * past it, and what it reads is cut short.
   */
  openReplyChannel(
    definedBy: string,
    handler: (payload: ClaimedPayload, signal: AbortSignal) => unknown,
    readTimeoutMs: number,
  ): Promise<Subscription> | undefined;
}

/**
 * The key under which a `SequenceServer` or `SequenceClient` takes its runtime: the module calls
 * `target[ATTACH_RUNTIME](runtime)` for each one it finds.
 */
export const ATTACH_RUNTIME = Symbol.for('nest-sequence:attach-runtime');

/** Something the module attaches its runtime to. */
export interface RuntimeTarget {
  [ATTACH_RUNTIME](runtime: SequenceRuntime): void;
}

export function isRuntimeTarget(value: unknown): value is RuntimeTarget {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Partial<RuntimeTarget>)[ATTACH_RUNTIME] === 'function'
  );
}
