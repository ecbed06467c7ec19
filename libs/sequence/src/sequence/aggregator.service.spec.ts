import {
  AggregatorService,
  InMemoryTransport,
  type InboundMessage,
  type SequenceModuleOptions,
  type SequencedHandlerOptions,
  type Subscription,
} from 'nest-sequence';
import { type MessageHandler, type SubscribeOptions } from 'nest-sequence/ports';
import { resolveModuleOptions } from '../options/resolve-options';
import { fragmentPrefetch } from '../options/resolve-sequence';
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

describe('the prefetch of a sequence consumer', () => {
  const MiB = 1024 * 1024;

  /** An in-memory transport (maxMessageBytes 16 MiB) that records each subscription's prefetch. */
  class RecordingTransport extends InMemoryTransport {
    readonly prefetchOf = new Map<string, number | undefined>();
    override subscribe(
      channel: string,
      handler: MessageHandler,
      options?: SubscribeOptions,
    ): Promise<Subscription> {
      this.prefetchOf.set(channel, options?.prefetch);
      return super.subscribe(channel, handler, options);
    }
  }

  it.each<[string, SequenceModuleOptions, SequencedHandlerOptions | object, number]>([
    ['16 MiB fragments fit twice in the default 32 MiB', {}, {}, 2],
    ['fragments of at most 2 MiB leave prefetch as it is', {}, { maxFragmentBytes: 2 * MiB }, 16],
    ['a prefetchBytes of the handler', {}, { prefetchBytes: 48 * MiB }, 3],
    ['a prefetchBytes below one fragment', { sequence: { prefetchBytes: MiB } }, {}, 1],
    ['a lower prefetch stands', { prefetch: 3 }, { maxFragmentBytes: MiB }, 3],
  ])(
    'subscribes a @SequencedHandler with the prefetch that fits prefetchBytes: %s',
    async (_, moduleOptions, handlerOptions, expected) => {
      const transport = new RecordingTransport();
      const t = await createSequenceTestApp('prefetch.bytes', {
        ...moduleOptions,
        transport,
        handler: handlerOptions,
      });
      try {
        expect(transport.prefetchOf.get('prefetch.bytes')).toBe(expected);
      } finally {
        await t.close();
      }
    },
  );

  it('leaves the module prefetch of other consumers alone', () => {
    const options = resolveModuleOptions([], {}, new InMemoryTransport()).sequence.consumer;
    expect(options.prefetch).toBe(16);
    expect(fragmentPrefetch(options)).toBe(2);
  });
});
