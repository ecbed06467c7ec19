import { AggregatorService, type InboundMessage } from 'nest-sequence';
import {
  createSequenceTestApp,
  makeFragments,
  type SequenceTestApp,
  type TestFragment,
} from '../../test/support/sequence-test-app';

describe('AggregatorService.receive with input no broker should send', () => {
  let t: SequenceTestApp;
  beforeEach(async () => (t = await createSequenceTestApp('aggregator.odd-input')));
  afterEach(() => t.close());

  const receive = (message: Partial<InboundMessage>) => {
    const aggregator = t.app.get(AggregatorService);
    const consumer = aggregator.createConsumer('aggregator.odd-input', () => undefined);
    return aggregator.receive(
      { channel: 'aggregator.odd-input', redelivered: false, ...message } as InboundMessage,
      consumer,
    );
  };

  it.each([
    ['undefined headers (amqplib reports no headers that way)', undefined],
    ['null headers', null],
    ['headers that are not an object', 'x-sequence-id=1'],
  ])('dead-letters a fragment with %s instead of throwing', async (_, headers) => {
    const disposition = await receive({ body: Buffer.from('x'), headers: headers as never });
    expect(disposition).toMatchObject({ action: 'dead-letter' });
    expect((disposition as { reason: string }).reason).toMatch(
      /^malformed-header: x-sequence-id: missing/,
    );
  });

  it('dead-letters a body that is not a Buffer instead of throwing', async () => {
    const disposition = await receive({ body: 'text' as never, headers: {} });
    expect(disposition).toEqual({
      action: 'dead-letter',
      reason: 'malformed-header: the message body is not binary',
    });
  });
});

describe('AggregatorService.receive after a sequence failed', () => {
  let t: SequenceTestApp;
  beforeEach(async () => (t = await createSequenceTestApp('aggregator.failed')));
  afterEach(() => t.close());

  it('dead-letters the completing fragment again when it comes back (its dead letter did not go out), and late duplicates too', async () => {
    const aggregator = t.app.get(AggregatorService);
    const consumer = aggregator.createConsumer(
      'aggregator.failed',
      () => {
        throw new Error('database unavailable');
      },
      { handlerRetry: { attempts: 1 } },
    );
    const [first, last] = makeFragments('seq-failed', Buffer.from('abcdefgh'), 4);
    const receive = (fragment: TestFragment, redelivered = false) =>
      aggregator.receive(
        {
          channel: 'aggregator.failed',
          body: fragment.body,
          headers: fragment.headers,
          redelivered,
        },
        consumer,
      );
    expect(await receive(first)).toEqual({ action: 'ack' });
    const verdict = await receive(last);
    expect(verdict).toEqual({
      action: 'dead-letter',
      reason: expect.stringMatching(/^handler-failed: /) as string,
    });

    // The transport could not publish that dead letter, so the message came back.
    expect(await receive(last, true)).toEqual(verdict);
    expect(await receive(first, true)).toEqual(verdict);
  });
});
