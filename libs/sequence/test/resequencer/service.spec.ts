import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  ClaimCheck,
  InMemoryTransport,
  Resequenced,
  ResequencerService,
  SequenceHandlerConflictError,
  SequenceModule,
  SequenceOptionsError,
  type ResequencedEvent,
  type ResequencerDefinition,
} from 'nest-sequence';
import { resequencedHandler } from './resequencer-test-app';

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const headersOf = (key: string, seq: number) => ({
  'x-resequence-key': key,
  'x-resequence-seq': seq,
});

describe('ResequencerService', () => {
  let transport: InMemoryTransport;

  beforeEach(() => {
    transport = new InMemoryTransport();
  });

  afterEach(async () => {
    await transport.close();
  });

  async function serviceApp() {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          tuning: { sweepers: { gaps: { intervalMs: false } } },
        }),
      ],
    }).compile();
    const app = await moduleRef.init();
    return { app, service: app.get(ResequencerService) };
  }

  it('takes a Uint8Array body as a Buffer, and dead-letters a body that is neither', async () => {
    const { app, service } = await serviceApp();
    const seen: string[] = [];
    const resequencer = service.create(
      { channel: 'own.queue', gap: GAP },
      (event: ResequencedEvent) => void seen.push(event.body.toString()),
    );
    // From a subscriber of another client library (NATS, for one), bodies come as Uint8Array.
    await expect(
      resequencer.receive({
        body: new Uint8Array([104, 105]) as Buffer,
        headers: headersOf('K', 1),
      }),
    ).resolves.toEqual({ action: 'ack' });
    expect(seen).toEqual(['hi']);
    await expect(
      resequencer.receive({ body: 'text' as unknown as Buffer, headers: headersOf('K', 2) }),
    ).resolves.toEqual({
      action: 'dead-letter',
      reason: expect.stringMatching(
        /^invalid-resequence-event: key K, event 2: the body must be a Buffer or a Uint8Array, got string$/,
      ),
    });
    expect(await service.nextExpected('own.queue', 'K')).toBe(2);
    await app.close();
  });

  it('runs a resequencer for a caller that consumes by itself: dispositions, order, inspection', async () => {
    const { app, service } = await serviceApp();
    const seen: number[] = [];
    const resequencer = service.create(
      { channel: 'own.queue', gap: GAP },
      (event: ResequencedEvent) => void seen.push(event.seq),
    );
    const receive = (seq: number) =>
      resequencer.receive({ body: Buffer.from(`#${seq}`), headers: headersOf('K', seq) });

    await expect(receive(3)).resolves.toEqual({ action: 'ack' });
    await expect(receive(2)).resolves.toEqual({ action: 'ack' });
    expect(await service.nextExpected('own.queue', 'K')).toBe(1);
    expect(await service.buffered('own.queue', 'K')).toEqual([2, 3]);
    expect(await service.openGaps('own.queue')).toEqual([
      expect.objectContaining({ key: 'K', expected: 1, buffered: 2, lowest: 2 }),
    ]);
    expect(seen).toEqual([]);

    await expect(
      service.receive('own.queue', { body: Buffer.from('#1'), headers: headersOf('K', 1) }),
    ).resolves.toEqual({ action: 'ack' });
    expect(seen).toEqual([1, 2, 3]);
    expect(await service.inspect('own.queue', 'K')).toEqual({ next: 4, buffered: [], handOff: 0 });
    expect(await service.openGaps('own.queue')).toEqual([]);
    // It did not subscribe: nothing consumes own.queue.
    await transport.publish('own.queue', Buffer.from('x'), headersOf('K', 4));
    expect(transport.peek('own.queue')).toHaveLength(1);
    await app.close();
  });

  it('refuses an unknown resequencer name, listing the known ones', async () => {
    const { app, service } = await serviceApp();
    service.create({ channel: 'a', gap: GAP }, () => undefined);
    expect(() => service.named('b')).toThrow('no resequencer named b; known: a');
    await app.close();
  });

  it.each<[string, Partial<ResequencerDefinition>, RegExp]>([
    ['no gap', { gap: undefined }, /gap is required/],
    ['a bad policy', { gap: { timeoutMs: 1, policy: 'wait' as 'alert' } }, /gap.policy must be/],
    [
      'a zero timeout',
      { gap: { timeoutMs: 0, policy: 'skip' } },
      /gap.timeoutMs must be an integer >= 1/,
    ],
    ['output = channel', { output: 'in' }, /output must differ from channel/],
    ['no output and no handler', { callHandler: false }, /callHandler: false needs an output/],
    ['a negative start', { start: -1 }, /start must be an integer >= 0/],
    [
      'a start whose successor would not be exact',
      { start: Number.MAX_SAFE_INTEGER },
      /start must be an integer >= 0 \(at most 9007199254740990\)/,
    ],
    ['no handler and no output', {}, /a handler is needed/],
    [
      'callHandler but no handler',
      { output: 'out', callHandler: true },
      /callHandler is true .* but no handler was given/,
    ],
    [
      'a string bound',
      { maxBufferedPerKey: '5' as unknown as number },
      /convert values read from the environment/,
    ],
    [
      'a zero byte budget',
      { maxBufferedBytesPerKey: 0 },
      /maxBufferedBytesPerKey must be an integer >= 1/,
    ],
    [
      'a zero outputInFlight',
      { output: 'out', outputInFlight: 0 },
      /outputInFlight must be an integer >= 1/,
    ],
    [
      'a huge outputInFlight',
      { output: 'out', outputInFlight: 257 },
      /outputInFlight must be at most 256, got 257/,
    ],
    [
      'an outputInFlight above the module tuning.drain.batchSize (32 by default)',
      { output: 'out', outputInFlight: 33 },
      /outputInFlight \(33\) must be at most the module's tuning\.drain\.batchSize \(32\)/,
    ],
    [
      'a deadLetterChannel of null (from a config file)',
      { deadLetterChannel: null as never },
      /deadLetterChannel is null: give a value, or leave the key out for its default/,
    ],
    [
      'outputInFlight without output',
      { outputInFlight: 4 },
      /outputInFlight above 1 needs an output channel/,
    ],
    [
      'a callHandler that is not a boolean (a string from a config file)',
      { output: 'out', callHandler: 'false' as never },
      /callHandler must be true or false, got "false"/,
    ],
    [
      'outputInFlight with the handler',
      { output: 'out', callHandler: true, outputInFlight: 4 },
      /outputInFlight above 1 needs an output channel and no handler call/,
    ],
  ])('refuses a definition with %s, saying what to fix', async (_case, change, message) => {
    const { app, service } = await serviceApp();
    const definition = { channel: 'in', gap: GAP, ...change };
    expect(() => service.create(definition)).toThrow(SequenceOptionsError);
    expect(() => service.create(definition)).toThrow(message);
    await app.close();
  });

  it('refuses an option given as null once, naming it', async () => {
    const { app, service } = await serviceApp();
    const definition = { channel: 'in', gap: GAP, deadLetterChannel: null, prefetch: null };
    let thrown: unknown;
    try {
      service.create(definition as never);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(SequenceOptionsError);
    expect((thrown as SequenceOptionsError).problems).toEqual([
      'deadLetterChannel is null: give a value, or leave the key out for its default',
      'prefetch is null: give a value, or leave the key out for its default',
    ]);
    await app.close();
  });

  it('refuses bad module options at bootstrap', async () => {
    const build = Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          resequencer: { overflow: 'drop' as 'dead-letter' },
          tuning: { drain: { batchSize: 0 } },
        }),
      ],
    }).compile();
    await expect(build).rejects.toThrow(/tuning\.drain\.batchSize must be an integer >= 1, got 0/);
    await expect(build).rejects.toThrow(
      /overflow must be 'backpressure' or 'dead-letter', got "drop"/,
    );
  });

  it('refuses two consumers of one channel: a resequencer and a claim-check handler', async () => {
    @Injectable()
    class Archive {
      @ClaimCheck({ channel: 'shared' })
      archive(): void {}
    }
    const Handler = resequencedHandler({ channel: 'shared', gap: GAP });
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport })],
      providers: [Archive, Handler],
    }).compile();
    // init() fails in onModuleInit, before anything was opened: there is nothing to close.
    await expect(moduleRef.init()).rejects.toThrow(SequenceHandlerConflictError);
  });

  it('refuses two resequencers with one name', async () => {
    @Injectable()
    class Two {
      @Resequenced({ channel: 'x', name: 'same', gap: GAP })
      one(): void {}

      @Resequenced({ channel: 'y', name: 'same', gap: GAP })
      two(): void {}
    }
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport })],
      providers: [Two],
    }).compile();
    await expect(moduleRef.init()).rejects.toThrow(/a resequencer named same is already defined/);
  });
});
