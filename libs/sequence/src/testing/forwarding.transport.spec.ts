import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import type { MessageHandler, ReplyChannelOptions, Subscription } from '../ports/transport.port';
import { ForwardingTransport } from './forwarding.transport';

class Plain extends ForwardingTransport {
  readonly name = 'plain';
}

class WithoutReplies extends ForwardingTransport {
  readonly name = 'without-replies';

  constructor(inner: InMemoryTransport) {
    super(inner, ['openReplyChannel', 'isReplyChannel']);
  }
}

/** Counts reply channels opened, then opens the real one through `super`. */
class CountingReplies extends ForwardingTransport {
  readonly name = 'counting-replies';
  opened = 0;

  override openReplyChannel(
    handler: MessageHandler,
    options?: ReplyChannelOptions,
  ): Promise<Subscription> {
    this.opened++;
    return super.openReplyChannel!(handler, options);
  }
}

/** A transport with the port's required methods only. */
const bare = () => {
  const full = new InMemoryTransport();
  return {
    name: 'bare',
    maxMessageBytes: full.maxMessageBytes,
    publish: full.publish.bind(full),
    subscribe: full.subscribe.bind(full),
    deadLetterChannel: full.deadLetterChannel.bind(full),
    ping: full.ping.bind(full),
    close: full.close.bind(full),
  };
};

describe('ForwardingTransport', () => {
  it('forwards the optional methods the real transport has, and only those', async () => {
    const inner = new InMemoryTransport();
    const wrapped = new Plain(inner);
    const replies = await wrapped.openReplyChannel!(async () => ({ action: 'ack' }));
    expect(wrapped.isReplyChannel!(replies.channel)).toBe(true);
    expect(wrapped.isReplyChannel!('orders')).toBe(false);
    expect(wrapped.droppedDeadLetters!()).toBe(0);
    expect(wrapped.deadLetters!()).toBeDefined();
    expect(wrapped.onDeadLetter).toBeUndefined(); // the in-memory transport has none
    await replies.close();

    const lacking = new Plain(bare());
    expect(lacking.openReplyChannel).toBeUndefined();
    expect(lacking.isReplyChannel).toBeUndefined();
    expect(lacking.deadLetters).toBeUndefined();
  });

  it('leaves out what it is told to, whatever the real transport has', () => {
    const wrapped = new WithoutReplies(new InMemoryTransport());
    expect(wrapped.openReplyChannel).toBeUndefined();
    expect(wrapped.isReplyChannel).toBeUndefined();
    expect(wrapped.deadLetters).toBeDefined();
  });

  it("keeps a subclass's own method, which reaches the real one through super", async () => {
    const wrapped = new CountingReplies(new InMemoryTransport());
    const replies = await wrapped.openReplyChannel(async () => ({ action: 'ack' }));
    expect(wrapped.opened).toBe(1);
    expect(wrapped.isReplyChannel!(replies.channel)).toBe(true);
    await replies.close();
  });
});
