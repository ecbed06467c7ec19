import { Injectable, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  ClaimCheck,
  InboxHandler,
  Resequenced,
  SequencedHandler,
  ResequencerService,
  SequenceHandlerConflictError,
  SequenceModule,
  SequenceOptionsError,
  type ClaimedPayload,
  type ReassembledPayload,
  type ResequencedEvent,
  type SequenceModuleOptions,
} from 'nest-sequence';
import type { ChannelBinding } from './channel-binding';
import { ChannelRegistry } from './channel.registry';

const binding = (overrides: Partial<ChannelBinding>): ChannelBinding => ({
  channel: 'c',
  kind: '@SequencedHandler',
  definedBy: 'A.handle',
  prefetch: 16,
  receive: () => Promise.resolve({ action: 'ack' }),
  describe: 'consumes sequences from',
  ...overrides,
});

describe('ChannelRegistry', () => {
  it('refuses a second handler on a channel, naming both, whichever came first', () => {
    for (const [first, second] of [
      ['@SequencedHandler', '@ClaimCheck'],
      ['@ClaimCheck', '@SequencedHandler'],
    ]) {
      const registry = new ChannelRegistry();
      registry.add(binding({ kind: first, definedBy: `First.${first}` }));
      let error: unknown;
      try {
        registry.add(binding({ kind: second, definedBy: `Second.${second}` }));
      } catch (caught) {
        error = caught;
      }
      expect(error).toBeInstanceOf(SequenceHandlerConflictError);
      expect(error).toMatchObject({
        channel: 'c',
        first: `First.${first}`,
        second: `Second.${second}`,
      });
    }
  });

  it('makes shared bindings of one kind one subscription, with the smallest prefetch', () => {
    const registry = new ChannelRegistry();
    registry.add(binding({ kind: '@InboxHandler', shared: true, definedBy: 'A.x', prefetch: 32 }));
    registry.add(binding({ kind: '@InboxHandler', shared: true, definedBy: 'B.y', prefetch: 8 }));

    expect(registry.all()).toHaveLength(1);
    expect(registry.get('c')).toMatchObject({ definedBy: 'A.x, B.y', prefetch: 8 });
  });

  it('takes bindings out again leaving a shared channel they joined with the handlers it had', () => {
    const registry = new ChannelRegistry();
    const eager = binding({ kind: '@InboxHandler', shared: true, definedBy: 'A.x', prefetch: 32 });
    registry.add(eager);

    const takeOut = registry.addAll([
      binding({ kind: '@InboxHandler', shared: true, definedBy: 'B.y', prefetch: 8 }),
      binding({ channel: 'd', definedBy: 'B.z' }),
    ]);
    expect(registry.get('c')).toMatchObject({ definedBy: 'A.x, B.y' });
    takeOut();

    expect(registry.get('c')).toBe(eager);
    expect(registry.get('d')).toBeUndefined();
  });

  it('refuses a shared binding on a channel that another kind consumes', () => {
    const registry = new ChannelRegistry();
    registry.add(binding({ kind: '@Resequenced', definedBy: 'A.x' }));

    expect(() =>
      registry.add(binding({ kind: '@InboxHandler', shared: true, definedBy: 'B.y' })),
    ).toThrow(SequenceHandlerConflictError);
  });
});

describe('handlers of different kinds on one channel', () => {
  @Injectable()
  class Sequences {
    @SequencedHandler({ channel: 'shared' })
    async handle(_payload: ReassembledPayload): Promise<void> {}
  }
  @Injectable()
  class Claims {
    @ClaimCheck({ channel: 'shared' })
    async handle(_payload: ClaimedPayload): Promise<void> {}
  }
  @Injectable()
  class Events {
    @Resequenced({ channel: 'shared', gap: { timeoutMs: 1_000, policy: 'alert' } })
    async handle(_event: ResequencedEvent): Promise<void> {}
  }
  @Injectable()
  class Inbox {
    @InboxHandler({ event: 'Shared', channel: 'shared' })
    async handle(): Promise<void> {}
  }

  /** Why an app with `providers`, in this order, does not start. */
  async function bootError(providers: Type[]): Promise<unknown> {
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot()],
      providers,
    }).compile();
    moduleRef.useLogger(false);
    return moduleRef.init().then(
      async (app) => {
        await app.close();
        return undefined;
      },
      (error: unknown) => error,
    );
  }

  const kinds: Array<[string, Type]> = [
    ['@SequencedHandler', Sequences],
    ['@ClaimCheck', Claims],
    ['@Resequenced', Events],
    ['@InboxHandler', Inbox],
  ];
  const pairs = kinds.flatMap((a, i) => kinds.filter((_, j) => j !== i).map((b) => [a, b]));

  it.each(pairs)('refuse to start, %s before %s', async ([, first], [, second]) => {
    const error = await bootError([first, second]);

    expect(error).toBeInstanceOf(SequenceHandlerConflictError);
    expect((error as SequenceHandlerConflictError).channel).toBe('shared');
  });
});

describe('a handler that would dead-letter into a channel it consumes', () => {
  /** Why an app with these module options and `providers` does not start. */
  async function bootError(
    providers: Type[],
    options: SequenceModuleOptions = {},
  ): Promise<unknown> {
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot(options)],
      providers,
    }).compile();
    moduleRef.useLogger(false);
    return moduleRef.init().then(
      async (app) => {
        await app.close();
        return undefined;
      },
      (error: unknown) => error,
    );
  }

  @Injectable()
  class Sequences {
    @SequencedHandler({ channel: 'scans', deadLetterChannel: 'scans' })
    async handle(_payload: ReassembledPayload): Promise<void> {}
  }
  @Injectable()
  class StreamedSequences {
    @SequencedHandler({ channel: 'scans', mode: 'stream', deadLetterChannel: 'scans' })
    async handle(): Promise<void> {}
  }
  @Injectable()
  class Claims {
    @ClaimCheck({ channel: 'scans', deadLetterChannel: 'scans' })
    async handle(_payload: ClaimedPayload): Promise<void> {}
  }
  @Injectable()
  class Events {
    @Resequenced({
      channel: 'scans',
      deadLetterChannel: 'scans',
      gap: { timeoutMs: 1_000, policy: 'alert' },
    })
    async handle(_event: ResequencedEvent): Promise<void> {}
  }

  it.each<[string, Type]>([
    ['@SequencedHandler', Sequences],
    ['@SequencedHandler (stream mode)', StreamedSequences],
    ['@ClaimCheck', Claims],
    ['@Resequenced', Events],
  ])(
    '%s naming its own channel refuses to start, naming the method and the channel',
    async (_, handler) => {
      const error = await bootError([handler]);

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).where).toMatch(
        new RegExp(`on ${handler.name}\\.handle$`),
      );
      expect((error as SequenceOptionsError).problems).toEqual([
        expect.stringContaining('deadLetterChannel is scans, the channel this handler consumes'),
      ]);
    },
  );

  it("a @SequencedHandler inheriting the module's sequence.deadLetterChannel refuses to start, naming that option", async () => {
    @Injectable()
    class Errors {
      @SequencedHandler({ channel: 'errors' })
      async handle(_payload: ReassembledPayload): Promise<void> {}
    }

    const error = await bootError([Errors], { sequence: { deadLetterChannel: 'errors' } });

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).where).toBe('@SequencedHandler on Errors.handle');
    expect((error as SequenceOptionsError).problems).toEqual([
      expect.stringContaining(
        "the module's sequence.deadLetterChannel is errors, the channel this handler consumes",
      ),
    ]);
  });

  it('ResequencerService.create refuses a deadLetterChannel equal to its channel', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot()],
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();
    try {
      const create = () =>
        app.get(ResequencerService).create(
          {
            channel: 'moves',
            deadLetterChannel: 'moves',
            gap: { timeoutMs: 1_000, policy: 'skip' },
          },
          () => undefined,
        );
      expect(create).toThrow(SequenceOptionsError);
      expect(create).toThrow('deadLetterChannel is moves, the channel this handler consumes');
    } finally {
      await app.close();
    }
  });

  it("still starts when a handler dead-letters into another handler's channel", async () => {
    @Injectable()
    class Orders {
      @SequencedHandler({ channel: 'orders', deadLetterChannel: 'orders.parked' })
      async handle(_payload: ReassembledPayload): Promise<void> {}
    }
    @Injectable()
    class Parked {
      @SequencedHandler({ channel: 'orders.parked' })
      async handle(_payload: ReassembledPayload): Promise<void> {}
    }

    expect(await bootError([Orders, Parked])).toBeUndefined();
  });

  it('the registry refuses a binding whose dead-letter channel is its own channel', () => {
    const registry = new ChannelRegistry();

    expect(() =>
      registry.add(binding({ channel: 'c', deadLetterChannel: 'c', definedBy: 'A.handle' })),
    ).toThrow(SequenceOptionsError);
    expect(registry.all()).toEqual([]);
  });
});
