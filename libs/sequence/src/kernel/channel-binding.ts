import type { Disposition, InboundMessage } from '../ports/transport.port';
import type { DecoratedMethod } from './decorated-methods';

/** One channel a handler consumes, as the consumer host subscribes to it. */
export interface ChannelBinding {
  readonly channel: string;
  /** Which kind of handler consumes it: `@SequencedHandler`, `@ClaimCheck`... */
  readonly kind: string;
  /** Who defined it, for messages: `ClassName.methodName`. */
  readonly definedBy: string;
  /**
   * Bindings of one kind that may share a channel, all receiving through the same `receive` (the
   * inbox handlers of several message types on one channel): one subscription, with the
   * smallest prefetch.
   */
  readonly shared?: boolean;
  readonly prefetch: number;
  readonly deadLetterChannel?: string;
  /** Takes one message and says what to do with it; never throws. */
  receive(message: InboundMessage): Promise<Disposition>;
  /**
   * Also consume the channel's partitions (see `Transport.partitioned`): `count` of them, each
   * with `prefetch` unsettled at most, through `receive`, which may keep messages unsettled for
   * long. `release`, called as shutdown begins, hands back what it keeps that no handler is
   * working on, so that the drain does not wait for it.
   */
  readonly partitions?: {
    readonly count: number;
    readonly prefetch: number;
    receive(message: InboundMessage): Promise<Disposition>;
    release?(): void;
  };
  /** What it does, for the log line at subscription: `consumes sequences from`... */
  readonly describe: string;
  /**
   * The state this consumer acks messages into, store by store: where a store lives in this
   * process only, with a broker that keeps messages, a crash loses what was acked, and the
   * module warns at startup.
   */
  readonly inProcessState?: readonly InProcessState[];
}

/** One kind of state a consumer keeps, and the store that keeps it. */
export interface InProcessState {
  /** What is kept, e.g. "sequence fragments". */
  readonly what: string;
  /** The store holding it: the warning is given when its `name` is `'memory'`. */
  readonly storeName: string;
  /** Which option to set instead, e.g. "`sequence.store` or `stores: redis(url)`". */
  readonly fix: string;
}

/**
 * A kind of decorated handler: its decorator's metadata, and how a method carrying it is bound to
 * the channels it consumes. The handler explorer drives one table of them; each pattern offers
 * its own.
 */
export interface HandlerKind<Options = unknown> {
  /** The decorator's name, for messages, e.g. `@SequencedHandler`. */
  readonly decorator: string;
  readonly metadataKey: string;
  /**
   * Validates one method's options and binds it (throws SequenceOptionsError naming the method);
   * returns the channels it consumes.
   */
  bind(method: DecoratedMethod<Options>): ChannelBinding[];
}

/** Injection token of the handler kinds the explorer looks for. */
export const HANDLER_KINDS = Symbol('nest-sequence:handler-kinds');
