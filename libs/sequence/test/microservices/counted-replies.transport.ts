import type { HeaderMap, PublishOptions } from 'nest-sequence/ports';
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
    if (this.isReplyChannel?.(channel) === true) this.replies++;
    return super.publish(channel, body, headers, options);
  }
}
