import { randomUUID } from 'node:crypto';
import type { ResequencerKey, ResequencerStore } from '../../ports/resequencer-store.port';
import { describeAcceptCases } from './resequencer-store/accept.cases';
import { describeConcurrencyCases } from './resequencer-store/concurrency.cases';
import { describeDrainCases } from './resequencer-store/drain.cases';
import { describeExpiringGapCases } from './resequencer-store/expiring-gaps.cases';
import { describeGapCases } from './resequencer-store/gaps.cases';
import { describeGapStatsCases } from './resequencer-store/gap-stats.cases';
import { describeHeldLimitCases } from './resequencer-store/held-limits.cases';
import { describeRetireCases } from './resequencer-store/retire.cases';
import {
  acceptAt,
  drainAt,
  event,
  type ResequencerSuiteContext,
} from './resequencer-store/resequencer-suite.context';

/** What the bundled stores keep a key after its last change, unless told otherwise. */
const DEFAULT_RETENTION_MS = 604_800_000;

export interface ResequencerStoreHarness {
  /** A fresh, empty store (for a server-backed store: under a key prefix of its own). */
  create(): Promise<ResequencerStore>;
  /**
   * Another instance over the same shared state, as a second consumer instance would have it
   * (its own connection for a server-backed store; the store itself for an in-process one).
   * Closed by the suite with `close`.
   */
  peer(store: ResequencerStore): Promise<ResequencerStore>;
  /** Closes a store (created or peer) and cleans up; `store.close()` when absent. */
  close?(store: ResequencerStore): Promise<void>;
  /** The `retentionMs` of the stores `create` makes. @default 604_800_000 (7 days) */
  readonly retentionMs?: number;
}

/**
 * The {@link ResequencerStore} contract, run against every adapter. Each test has a scope of
 * its own and explicit `now` values near the real clock, so that adapters that also keep
 * server-side TTLs see realistic ones. Retention itself is adapter-specific (a server's TTL runs
 * on its own clock) and is tested by each adapter's spec; `listExpiringGaps` is tested here, with
 * times past `t0` by up to the harness's `retentionMs`.
 */
export function describeResequencerStoreConformance(
  name: string,
  harness: ResequencerStoreHarness,
): void {
  describe(`ResequencerStore conformance: ${name}`, () => {
    let opened: ResequencerStore[] = [];
    const context = {} as {
      -readonly [K in keyof ResequencerSuiteContext]: ResequencerSuiteContext[K];
    };

    beforeEach(async () => {
      const store = await harness.create();
      const scope = `orders.${randomUUID()}`;
      opened = [store];
      Object.assign(context, {
        store,
        scope,
        t0: Date.now(),
        retentionMs: harness.retentionMs ?? DEFAULT_RETENTION_MS,
        key: (key = 'order-1'): ResequencerKey => ({ scope, key }),
        peer: async () => {
          const other = await harness.peer(store);
          opened.push(other);
          return other;
        },
      });
    });

    afterEach(async () => {
      // Peers first: the store they share state with is cleaned up last.
      for (const each of [...new Set(opened)].reverse()) {
        await (harness.close ? harness.close(each) : each.close());
      }
    });

    it('has a name and answers ping', async () => {
      expect(typeof context.store.name).toBe('string');
      expect(context.store.name.length).toBeGreaterThan(0);
      await expect(context.store.ping()).resolves.toBeUndefined();
    });

    describeAcceptCases(context);
    describeDrainCases(context);
    describeGapCases(context);
    describeGapStatsCases(context);
    describeExpiringGapCases(context);
    describeHeldLimitCases(context);
    describeRetireCases(context);
    describeConcurrencyCases(context);

    describe('arguments', () => {
      const key = (): ResequencerKey => context.key();
      const now = (): number => context.t0;
      const limits = (maxBufferedPerKey: number, maxBufferedTotal: number) =>
        acceptAt(now(), { limits: { maxBufferedPerKey, maxBufferedTotal } });
      const store = (): ResequencerStore => context.store;

      it.each([
        [
          'an empty scope',
          () => store().accept({ ...key(), scope: '' }, event(1), acceptAt(now())),
        ],
        ['an empty key', () => store().accept({ ...key(), key: '' }, event(1), acceptAt(now()))],
        [
          'a key of 257 characters',
          () => store().accept({ ...key(), key: 'k'.repeat(257) }, event(1), acceptAt(now())),
        ],
        [
          'a key with a control character',
          () => store().accept({ ...key(), key: 'a\nb' }, event(1), acceptAt(now())),
        ],
        [
          // Redis keeps keys as UTF-8, where every lone surrogate is the same U+FFFD: two such
          // keys would share one state.
          'a key with a lone surrogate',
          () => store().accept({ ...key(), key: 'acct-\ud800' }, event(1), acceptAt(now())),
        ],
        [
          'a key with a lone low surrogate',
          () => store().accept({ ...key(), key: '\udc00-acct' }, event(1), acceptAt(now())),
        ],
        ['a negative sequence', () => store().accept(key(), event(-1), acceptAt(now()))],
        ['a fractional sequence', () => store().accept(key(), event(1.5), acceptAt(now()))],
        ['maxBufferedPerKey 0', () => store().accept(key(), event(2), limits(0, 10))],
        ['a fractional maxBufferedTotal', () => store().accept(key(), event(2), limits(10, 1.5))],
        ['a lease of 0 ms', () => store().claimDrain(key(), { ...drainAt(now()), leaseMs: 0 })],
        ['a drain limit of 0', () => store().claimDrain(key(), drainAt(now(), 'a', 0))],
        ['a settle count of 0', () => store().settleDrain(key(), 0, drainAt(now()))],
        ['a fractional settle count', () => store().settleDrain(key(), 1.5, drainAt(now()))],
        ['an invalid key to inspect', () => store().inspect({ ...key(), key: '' }, 1)],
        ['gap stats of an empty scope', () => store().gapStats('', now())],
        ['gap stats at a time that is not a number', () => store().gapStats('s', Number.NaN)],
        ['expiring gaps of an empty scope', () => store().listExpiringGaps('', now(), 10)],
        ['expiring gaps with a limit of 0', () => store().listExpiringGaps('s', now(), 0)],
        [
          'expiring gaps at a time that is not a number',
          () => store().listExpiringGaps('s', Number.NaN, 10),
        ],
        ['a retirement of 0 ms', () => store().retire(key(), 0, now())],
        ['a retirement of a fractional time', () => store().retire(key(), 1.5, now())],
        ['a retirement at a time that is not a number', () => store().retire(key(), 1, Number.NaN)],
        ['a retirement of an invalid key', () => store().retire({ ...key(), key: '' }, 1, now())],
        [
          'a gap resolution with an unchangedSince that is not a number',
          () =>
            store().resolveGap(key(), 'dead-letter', {
              openedBefore: now(),
              now: now(),
              unchangedSince: Number.NaN,
            }),
        ],
      ])('rejects %s with a RangeError', async (_case, call) => {
        await expect(call()).rejects.toThrow(RangeError);
      });
    });
  });
}
