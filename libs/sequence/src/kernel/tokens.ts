import type { ClaimLedger } from '../ports/claim-ledger.port';
import type { OutboxStore } from '../ports/outbox-store.port';
import type { PayloadStore } from '../ports/payload-store.port';
import type { ExpiryPolicy } from '../ports/sequence-store.port';

// Injection tokens of what the module (the composition root) hands the patterns: the resolved
// options and the adapters it chose. Only SEQUENCE_TRANSPORT and SEQUENCE_METRICS_REGISTRY are
// public; the others are not exported from the package.

/** Injection token of the active {@link Transport} (public: apps publish and subscribe with it). */
export const SEQUENCE_TRANSPORT = Symbol('nest-sequence:transport');
/**
 * Injection token of the prom-client `Registry` the module's metrics are in (public: serve
 * `await registry.metrics()` on your scrape endpoint): `metrics.registry` when given, else the
 * module's own.
 */
export const SEQUENCE_METRICS_REGISTRY = Symbol('nest-sequence:metrics-registry');
/** Injection token of the resolved options ({@link ResolvedOptions}). */
export const RESOLVED_OPTIONS = Symbol('nest-sequence:options');
/**
 * Injection token of the sequence store's budgets ({@link SequenceBudgets}): what the health
 * indicator reports fill against, without the rest of the resolved options.
 */
export const SEQUENCE_BUDGETS = Symbol('nest-sequence:sequence-budgets');

/** The Message Sequence budgets, as `SEQUENCE_BUDGETS` provides them. */
export interface SequenceBudgets {
  readonly maxBufferedBytes: number;
  readonly maxChannelBufferedBytes: number;
}

/**
 * Injection token of the timeouts and sweep intervals ({@link SweepTiming}) that the health
 * indicators judge ages against, without the rest of the resolved options.
 */
export const SWEEP_TIMING = Symbol('nest-sequence:sweep-timing');

/** When the sweepers act on what is left open, as `SWEEP_TIMING` provides it. */
export interface SweepTiming {
  /** `sequence.timeoutMs` and `sequence.timeoutStrategy` (channels may set their own). */
  readonly sequenceTimeout: ExpiryPolicy;
  /** The expiry sweeper's interval; `false` when it does not run. */
  readonly expirySweepMs: number | false;
  /** The gap sweeper's interval; `false` when it does not run. */
  readonly gapSweepMs: number | false;
}

/** Injection token of the active {@link SequenceStore}. */
export const SEQUENCE_STORE = Symbol('nest-sequence:sequence-store');
/**
 * Injection token of the sequence store as Message Sequence and the console work on it: the
 * active one with each step given up on after `tuning.storeTimeoutMs` (sequence/bounded-store.ts).
 * `SEQUENCE_STORE` stays the adapter itself, for the health indicator, the metrics (each bounded
 * on its own) and the handler kinds' checks.
 */
export const BOUNDED_SEQUENCE_STORE = Symbol('nest-sequence:bounded-sequence-store');
/** Injection token of `claimCheck.readTimeoutMs`, for the console's reads of payload stores. */
export const PAYLOAD_READ_TIMEOUT_MS = Symbol('nest-sequence:payload-read-timeout-ms');
/** Injection token of the active {@link ResequencerStore}. */
export const RESEQUENCER_STORE = Symbol('nest-sequence:resequencer-store');
/** Injection token of the Claim Check's {@link ClaimCheckStores}. */
export const CLAIM_CHECK_STORES = Symbol('nest-sequence:claim-check-stores');
/** Injection token of the Outbox's {@link OutboxStoreSource}. */
export const OUTBOX_STORE_SOURCE = Symbol('nest-sequence:outbox-store');

/** Where Claim Check parks payloads and records claims. */
export interface ClaimCheckStores {
  /** Where new payloads go. */
  readonly store: PayloadStore;
  /** Every store tickets may name, by name (the write store first). */
  readonly stores: ReadonlyMap<string, PayloadStore>;
  readonly ledger: ClaimLedger;
}

/** The Outbox's database: the one the options name, or the embedded one, opened at first use. */
export interface OutboxStoreSource {
  /** The store given in the options (or by a `stores` set); undefined for the embedded one. */
  readonly store?: OutboxStore;
  /** Opens a new embedded store (in-memory SQLite); its opener closes it. */
  openEmbedded(): Promise<OutboxStore>;
}
