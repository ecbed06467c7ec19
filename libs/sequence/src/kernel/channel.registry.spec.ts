import { Injectable, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  ClaimCheck,
  InboxHandler,
  Resequenced,
  SequencedHandler,
  SequenceHandlerConflictError,
  SequenceModule,
  type ClaimedPayload,
  type ReassembledPayload,
  type ResequencedEvent,
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
