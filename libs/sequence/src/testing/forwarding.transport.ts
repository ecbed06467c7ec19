import type { HeaderMap } from '../core/headers';
import type { DeadLetterBox } from '../ports/dead-letter-box.port';
import type {
  MessageHandler,
  ReplyChannelOptions,
  PublishOptions,
  Subscription,
  SubscribeOptions,
  Transport,
} from '../ports/transport.port';

/** The optional methods of the Transport port, forwarded when the real transport has them. */
const OPTIONAL_METHODS = [
  'openReplyChannel',
  'isReplyChannel',
  'droppedDeadLetters',
  'onDeadLetter',
  'deadLetters',
] as const satisfies ReadonlyArray<keyof Transport>;

type OptionalMethod = (typeof OPTIONAL_METHODS)[number];

// The optional methods, as the constructor forwards them (methods, so that a subclass may define its own).
// eslint-disable-next-line @typescript-eslint/no-unsafe-declaration-merging
export interface ForwardingTransport {
  openReplyChannel?(handler: MessageHandler, options?: ReplyChannelOptions): Promise<Subscription>;
  isReplyChannel?(channel: string): boolean;
  droppedDeadLetters?(): number;
  onDeadLetter?(listener: (channel: string, reason: string) => void): () => void;
  deadLetters?(): DeadLetterBox;
}

/**
 * A {@link Transport} that hands every call to a real one: the base of test transports that
 * change what `publish` does (inject a fault, stop at a crash point) and nothing else.
 *
 * The port's optional methods (reply channels, dead-letter counts and listeners, the dead-letter
 * box) are forwarded too, each only where the real transport has it: a wrapped transport can do
 * what the real one can. They are set on the instance, bound to `inner`: a subclass that defines
 * one of them keeps its own, and calls the real one as `this.inner.openReplyChannel!(...)` (not
 * `super`); one that must not have one (to test an adapter without reply channels, say) names it
 * in `without`. The dead-letter box is the real transport's: its replays publish through `inner`,
 * not through the subclass's `publish`.
 *
 * @example
 * class SlowPublishes extends ForwardingTransport {
 *   readonly name = 'slow-publishes';
 *   override async publish(...args: Parameters<Transport['publish']>): Promise<void> {
 *     await new Promise((resolve) => setTimeout(resolve, 100));
 *     return super.publish(...args);
 *   }
 * }
 */
// eslint-disable-next-line @typescript-eslint/no-unsafe-declaration-merging
export abstract class ForwardingTransport implements Transport {
  abstract readonly name: string;
  readonly maxMessageBytes: number;
  /** The real transport's: its partition options are forwarded like any other. */
  readonly partitioned?: boolean;

  /** @param without optional methods of the port this transport does not have, whatever `inner` has */
  constructor(
    readonly inner: Transport,
    without: readonly OptionalMethod[] = [],
  ) {
    this.maxMessageBytes = inner.maxMessageBytes;
    this.partitioned = inner.partitioned;
    for (const name of OPTIONAL_METHODS) {
      const method = inner[name] as ((...args: never[]) => unknown) | undefined;
      // A subclass's own method (on its prototype) wins.
      if (typeof method !== 'function' || without.includes(name) || name in this) continue;
      Object.defineProperty(this, name, {
        value: method.bind(inner),
        configurable: true,
        writable: true,
      });
    }
  }

  publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    return this.inner.publish(channel, body, headers, options);
  }

  subscribe(
    channel: string,
    handler: MessageHandler,
    options?: SubscribeOptions,
  ): Promise<Subscription> {
    return this.inner.subscribe(channel, handler, options);
  }

  deadLetterChannel(channel: string): string {
    return this.inner.deadLetterChannel(channel);
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
