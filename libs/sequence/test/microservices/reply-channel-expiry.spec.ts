import { Controller, Logger } from '@nestjs/common';
import { Ctx, MessagePattern } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { AggregatorService, InMemoryTransport, type Transport } from 'nest-sequence';
import type { SequenceContext } from 'nest-sequence/microservices';
import { ForwardingTransport } from 'nest-sequence/testing';
import { ExpirySweeper } from '../../src/sequence/expiry.sweeper';
import { bytes, makeFragments } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

/** Records the channel of every publish. */
class PublishRecording extends ForwardingTransport {
  readonly name = 'publish-recording';
  readonly published: string[] = [];

  override publish(...args: Parameters<Transport['publish']>): Promise<void> {
    this.published.push(args[0]);
    return super.publish(...args);
  }
}

@Controller()
class ReplyChannels {
  /** Answers with the requester's reply channel. */
  @MessagePattern('expiry.reply-to')
  replyTo(@Ctx() ctx: SequenceContext): unknown {
    return ctx.getHeaders()['x-reply-to'];
  }
}

/**
 * A reply channel has no dead-letter channel (see `Transport.openReplyChannel`): a reply sent as
 * a Message Sequence whose fragments never all came expires like any sequence, without an
 * expiry record.
 */
describe('microservices: a reply sent as a Message Sequence that never completes', () => {
  const inner = new InMemoryTransport();
  const transport = new PublishRecording(inner);
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({ sequence: { transport }, controllers: [ReplyChannels] });
  });
  afterAll(async () => {
    await t?.close();
    await inner.close();
  });

  it('expires without an expiry record published for its reply channel', async () => {
    const replyTo = await lastValueFrom(t.client.send<string>('expiry.reply-to', {}));
    const [first] = makeFragments('half-a-reply', bytes(2_000, 3), 1_000, {
      'x-correlation-id': 'nobody-waits',
      'x-reply-status': 'ok',
    });
    await inner.publish(replyTo, first.body, first.headers);
    await inner.whenIdle();
    transport.published.length = 0;
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      expect(await t.app.get(ExpirySweeper).sweep(Date.now() + 24 * 60 * 60 * 1000)).toBe(1);
      expect(transport.published).toEqual([]);
      expect(errors).not.toHaveBeenCalled();
    } finally {
      errors.mockRestore();
    }
  });

  it('remembers no dead-letter channel for the reply channels its clients open', async () => {
    for (let reopened = 0; reopened < 3; reopened++) {
      await lastValueFrom(t.client.send('expiry.reply-to', {}));
      await t.client.close(); // the next send() opens a reply channel of its own
    }
    // Looked at inside: nothing else tells a channel the aggregator keeps from one it does not.
    const aggregator: unknown = t.app.get(AggregatorService);
    const { deadLetterChannels } = aggregator as { deadLetterChannels: Map<string, string> };
    const replyChannels = [...deadLetterChannels.keys()].filter((channel) =>
      inner.isReplyChannel(channel),
    );
    expect(replyChannels).toEqual([]);
  });
});
