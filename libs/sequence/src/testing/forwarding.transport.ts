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

/**
 * A {@link Transport} that hands every call to a real one: the base of test transports that
 * change what `publish` does (inject a fault, stop at a crash point) and nothing else.
 *
 * The port's optional methods (reply channels, dead-letter counts and listeners, the dead-letter
 * box) are forwarded too, each only where the real transport has it: a wrapped transport can do
 * what the real one can. A subclass may override one (and call `super`'s); one that must not have
 * one (to test an adapter without reply channels, say) names it in `without`. The dead-letter box
 * is the real transport's: its replays publish through `inner`, not through the subclass's
 * `publish`.
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
    // What the real transport lacks (or `without` names) this one lacks too, unless a subclass
    // defines its own: hidden on the instance, as the module tells capabilities by presence.
    const base = ForwardingTransport.prototype as unknown as Record<OptionalMethod, unknown>;
    for (const name of OPTIONAL_METHODS) {
      const lacking = typeof inner[name] !== 'function' || without.includes(name);
      const own = (this as unknown as Record<OptionalMethod, unknown>)[name] !== base[name];
      if (lacking && !own) {
        Object.defineProperty(this, name, { value: undefined, configurable: true, writable: true });
      }
    }
  }

  openReplyChannel?(handler: MessageHandler, options?: ReplyChannelOptions): Promise<Subscription> {
    return this.inner.openReplyChannel!(handler, options);
  }

  isReplyChannel?(channel: string): boolean {
    return this.inner.isReplyChannel!(channel);
  }

  droppedDeadLetters?(): number {
    return this.inner.droppedDeadLetters!();
  }

  onDeadLetter?(listener: (channel: string, reason: string) => void): () => void {
    return this.inner.onDeadLetter!(listener);
  }

  deadLetters?(): DeadLetterBox {
    return this.inner.deadLetters!();
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
