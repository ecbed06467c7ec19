import type {
  AcceptContext,
  DrainContext,
  DrainSettlement,
  HandOffItem,
  ResequencedEntry,
  ResequencerKey,
  ResequencerLimits,
  ResequencerStore,
} from '../../../ports/resequencer-store.port';
import type { HeaderValue } from '../../../core/headers';

/**
 * What every part of the resequencer-store conformance suite sees: replaced before each test
 * (a fresh store, a scope of its own, a clock near the real one). Parts read it inside their
 * tests only, never while jest collects them.
 */
export interface ResequencerSuiteContext {
  /** The store under test, fresh and empty. */
  readonly store: ResequencerStore;
  /** A scope no other test uses. */
  readonly scope: string;
  /** `Date.now()` when the test started: every `now` of the test is relative to it. */
  readonly t0: number;
  /** The retention of the store under test (ms): tests may pass times that far past `t0`. */
  readonly retentionMs: number;
  /** The key `name` of this test's scope. */
  key(name?: string): ResequencerKey;
  /** Another instance over the store's shared state; closed after the test. */
  peer(): Promise<ResequencerStore>;
}

/** Generous enough that no test meets them unless it means to. */
export const ROOMY: ResequencerLimits = { maxBufferedPerKey: 1_000, maxBufferedTotal: 100_000 };
export const LEASE_MS = 30_000;

/** An event whose body and headers name its sequence, so a mix-up shows. */
export function event(
  seq: number,
  body: Buffer = Buffer.from(`event-${seq}`),
  headers: Record<string, HeaderValue> = { 'x-resequence-seq': seq },
): ResequencedEntry {
  return { seq, body, headers };
}

export function acceptAt(
  now: number,
  options: { start?: number; limits?: Partial<ResequencerLimits> } = {},
): AcceptContext {
  return { start: options.start ?? 1, limits: { ...ROOMY, ...options.limits }, now };
}

export function drainAt(now: number, holder = 'drainer', limit = 100): DrainContext {
  return { holder, leaseMs: LEASE_MS, limit, now };
}

/** Accepts the sequences in the given order (start 1, roomy limits), one after the other. */
export async function acceptAll(
  store: ResequencerStore,
  key: ResequencerKey,
  seqs: readonly number[],
  now: number,
): Promise<void> {
  for (const seq of seqs) await store.accept(key, event(seq), acceptAt(now));
}

/**
 * Everything in the key's hand-off list, drained as a consumer would: claim, deliver, settle,
 * until `empty`. Fails on `busy` or `lost`, which a lone drainer must never see.
 */
export async function drainAll(
  store: ResequencerStore,
  key: ResequencerKey,
  now: number,
  holder = 'drainer',
  limit = 100,
): Promise<HandOffItem[]> {
  const delivered: HandOffItem[] = [];
  let answer: DrainSettlement = await store.claimDrain(key, drainAt(now, holder, limit));
  while (answer.kind === 'claimed') {
    expect(answer.items.length).toBeGreaterThan(0);
    delivered.push(...answer.items);
    answer = await store.settleDrain(key, answer.items.length, drainAt(now, holder, limit));
  }
  expect(answer.kind).toBe('empty');
  return delivered;
}

/** The sequences of the `event` items, in list order. */
export function eventSeqs(items: readonly HandOffItem[]): number[] {
  return items.flatMap((item) => (item.kind === 'event' ? [item.entry.seq] : []));
}

/** `from`..`to`, inclusive. */
export function range(from: number, to: number): number[] {
  return Array.from({ length: Math.max(0, to - from + 1) }, (_, index) => from + index);
}
