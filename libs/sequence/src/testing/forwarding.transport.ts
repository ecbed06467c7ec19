import type { HeaderMap } from '../core/headers';
import type {
  MessageHandler,
  PublishOptions,
  Subscription,
  SubscribeOptions,
  Transport,
} from '../ports/transport.port';

/**
 * A {@link Transport} that hands every call to a real one: the base of test transports that
 * change what `publish` does (inject a fault, stop at a crash point) and nothing else.
 */
export abstract class ForwardingTransport implements Transport {
  abstract readonly name: string;
  readonly maxMessageBytes: number;
  /** The real transport's: its partition options are forwarded like any other. */
  readonly partitioned?: boolean;

  constructor(readonly inner: Transport) {
    this.maxMessageBytes = inner.maxMessageBytes;
    this.partitioned = inner.partitioned;
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
