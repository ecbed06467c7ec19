import type {
  HeaderMap,
  MessageHandler,
  PublishOptions,
  ReplyChannelOptions,
  Subscription,
} from 'nest-sequence/ports';
import { ForwardingTransport } from 'nest-sequence/testing';

/** Counts the replies published (messages to the inner transport's reply channels). */
export class CountedReplies extends ForwardingTransport {
  readonly name: string = 'counted-replies';
  replies = 0;

  override publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    if (this.isReplyChannel(channel)) this.replies++;
    return super.publish(channel, body, headers, options);
  }

  openReplyChannel(handler: MessageHandler, options?: ReplyChannelOptions): Promise<Subscription> {
    return this.inner.openReplyChannel!(handler, options);
  }

  isReplyChannel(channel: string): boolean {
    return this.inner.isReplyChannel!(channel);
  }
}
