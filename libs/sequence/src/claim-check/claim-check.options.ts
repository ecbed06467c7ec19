import { randomBytes } from 'node:crypto';
import { EncryptingPayloadStore } from '../adapters/payload/encrypting/encrypting.payload-store';
import type { PayloadEncryptionKey } from '../adapters/payload/encrypting/payload-encryption.keys';
import { FilesystemPayloadStore } from '../adapters/payload/filesystem/filesystem.payload-store';
import { MemoryClaimLedger } from '../adapters/stores/memory/memory.claim-ledger';
import { MAX_TIMER_MS } from '../core/async';
import { ClaimTicketKeyring, type ClaimTicketKey } from '../core/claim-ticket-keyring';
import { STORE_NAME_PATTERN } from '../core/claim-ticket';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { ClaimLedger } from '../ports/claim-ledger.port';
import type { PayloadStore } from '../ports/payload-store.port';

const KiB = 1024;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/**
 * When a claimed payload is deleted, per consuming channel:
 * - `'ack'`: one consumer group; deleted once its handler succeeded (then the message is acked).
 * - `'ttl'`: fan-out to groups the sender does not count; deleted by the sweeper at expiry.
 * - `{ consumers: N }`: fan-out to N known groups; deleted once N distinct groups succeeded.
 */
export type ClaimRetention = 'ack' | 'ttl' | { readonly consumers: number };

/** Options of the Claim Check pattern (`SequenceModule.forRoot({ claimCheck })`). */
export interface ClaimCheckOptions {
  /** Where payloads are parked. @default a FilesystemPayloadStore under `<os tmpdir>/nest-sequence-payloads` */
  store?: PayloadStore;
  /** More stores tickets may name (read, release and sweep only), e.g. while migrating. */
  readStores?: PayloadStore[];
  /**
   * Records which consumer groups handled which ticket: makes a ticket delivered twice run its
   * handler once, and counts groups for `deleteAfter: { consumers }`. Must be shared by every
   * instance (Redis) when several consume one channel. @default a MemoryClaimLedger
   */
  ledger?: ClaimLedger;
  /**
   * HMAC keys for tickets: the first signs, all verify (rotation). Required as soon as tickets
   * cross processes. @default one random key per process (tickets only verify in that process)
   */
  signingKeys?: ClaimTicketKey[];
  /** AES-256-GCM encryption at rest: the first key encrypts, all decrypt. @default none */
  encryption?: { keys: PayloadEncryptionKey[] };
  /**
   * `publish()` sends payloads up to this many bytes inline.
   * @default 262144 (256 KiB), or less when one message of the transport carries less
   */
  threshold?: number;
  /** `publish(..., { mode: 'auto' })` sends payloads up to this size as a Message Sequence. @default 67108864 (64 MiB) */
  sequenceMaxBytes?: number;
  /** How long a checked-in payload (and its ticket) stays valid. @default 86400000 (24 h) */
  ttlMs?: number;
  /**
   * How long after its expiry the sweeper keeps a payload. A ticket is accepted up to its
   * `expiresAt`, and its handler may read the payload for a while after: the sweeper must not
   * delete it under that read. Keep it above the longest handler run on one delivery (retries
   * and the payload read included) plus the clock skew between instances. The Redis payload
   * store drops its keys at `expiresAt + keyTtlMarginMs` whatever this says: keep that margin
   * at or above this grace. @default 300000 (5 min)
   */
  expiredGraceMs?: number;
  /** How long a payload stored for `publish()` may wait for its ticket's confirm before it is an orphan. @default 3600000 (1 h) */
  orphanGraceMs?: number;
  /**
   * How often the orphan sweeper runs, at most 2147483647 (about 24.8 days, the longest a Node
   * timer waits); `false` disables it on this instance. @default 60000
   */
  sweepIntervalMs?: number | false;
  /** Payloads the sweeper deletes per run at most. @default 500 */
  sweepBatch?: number;
  /** Default retention of consuming channels. @default 'ack' */
  deleteAfter?: ClaimRetention;
  /**
   * Requeues a message may have had (its `x-requeue-count`: every delayed requeue, a busy
   * lease's included) when the payload store or the claim ledger fails on it again: then it is
   * dead-lettered `store-unavailable` instead (at the default backpressureDelayMs of 500 ms,
   * 1200 is about 10 minutes of outage). @default 1200
   */
  maxStoreRequeues?: number;
}

/** What the Claim Check parks payloads in and records claims in (health checks ping them). */
export type ClaimCheckStores = Pick<ResolvedClaimCheckOptions, 'stores' | 'ledger'>;

/** Claim Check options with every default applied and the keys validated. */
export interface ResolvedClaimCheckOptions {
  readonly store: PayloadStore;
  /** Every store tickets may name, by name (the write store first). */
  readonly stores: ReadonlyMap<string, PayloadStore>;
  readonly ledger: ClaimLedger;
  readonly keyring: ClaimTicketKeyring;
  /** The signing keys were generated at boot (not given). */
  readonly ephemeralKeys: boolean;
  readonly threshold: number;
  /** The largest payload one message of the transport carries inline: a threshold's ceiling. */
  readonly maxInlineBytes: number;
  readonly sequenceMaxBytes: number;
  readonly ttlMs: number;
  readonly orphanGraceMs: number;
  readonly expiredGraceMs: number;
  readonly sweepIntervalMs: number | false;
  readonly sweepBatch: number;
  readonly deleteAfter: ClaimRetention;
  readonly maxStoreRequeues: number;
  /** Adapters built here (defaults), which the module closes at shutdown. */
  readonly owned: ReadonlyArray<{ close(): Promise<void> }>;
}

export const CLAIM_CHECK_DEFAULTS = {
  threshold: 256 * KiB,
  sequenceMaxBytes: 64 * KiB * KiB,
  ttlMs: 24 * HOUR,
  orphanGraceMs: HOUR,
  expiredGraceMs: 5 * MINUTE,
  sweepIntervalMs: MINUTE,
  sweepBatch: 500,
  maxStoreRequeues: 1200,
  deleteAfter: 'ack',
} as const;

/** Applies defaults and validates; every problem is reported at once. */
export function resolveClaimCheckOptions(
  options: ClaimCheckOptions = {},
  /** Largest payload a message of the transport carries inline (headers left room). */
  maxInlineBytes = Number.MAX_SAFE_INTEGER,
  /** The longest one publish (its retries included) may take: see `orphanGraceMs`. */
  publishBudgetMs = 0,
): ResolvedClaimCheckOptions {
  const problems: string[] = [];
  const positive = (name: string, value: number) => {
    if (!Number.isSafeInteger(value) || value < 0) {
      problems.push(`${name} must be a non-negative integer, got ${String(value)}`);
    }
  };
  // The default shrinks to fit a transport with small messages; a given threshold must fit.
  const threshold =
    options.threshold ?? Math.max(0, Math.min(CLAIM_CHECK_DEFAULTS.threshold, maxInlineBytes));
  const ttlMs = options.ttlMs ?? CLAIM_CHECK_DEFAULTS.ttlMs;
  const sequenceMaxBytes = options.sequenceMaxBytes ?? CLAIM_CHECK_DEFAULTS.sequenceMaxBytes;
  positive('claimCheck.sequenceMaxBytes', sequenceMaxBytes);
  const orphanGraceMs = options.orphanGraceMs ?? CLAIM_CHECK_DEFAULTS.orphanGraceMs;
  const sweepBatch = options.sweepBatch ?? CLAIM_CHECK_DEFAULTS.sweepBatch;
  const maxStoreRequeues = options.maxStoreRequeues ?? CLAIM_CHECK_DEFAULTS.maxStoreRequeues;
  positive('claimCheck.maxStoreRequeues', maxStoreRequeues);
  const sweepIntervalMs = options.sweepIntervalMs ?? CLAIM_CHECK_DEFAULTS.sweepIntervalMs;
  positive('claimCheck.threshold', threshold);
  if (Number.isSafeInteger(threshold) && threshold > maxInlineBytes) {
    problems.push(
      `claimCheck.threshold (${threshold}) exceeds what one message of the transport carries ` +
        `(${maxInlineBytes} bytes besides headers); use at most ${maxInlineBytes}`,
    );
  }
  positive('claimCheck.ttlMs', ttlMs);
  if (Number.isSafeInteger(ttlMs) && ttlMs > MAX_TTL_MS) {
    problems.push(`claimCheck.ttlMs must be at most ${MAX_TTL_MS} (100 years), got ${ttlMs}`);
  }
  positive('claimCheck.orphanGraceMs', orphanGraceMs);
  if (Number.isSafeInteger(orphanGraceMs) && orphanGraceMs <= 2 * publishBudgetMs) {
    // A payload is an orphan-to-be from its store write until its ticket's publish is confirmed:
    // the sweeper must not take one whose ticket is still being published.
    problems.push(
      `claimCheck.orphanGraceMs (${orphanGraceMs}) must be above twice the longest a ticket's ` +
        `publish may take with its retries (publish.attempts × (confirmTimeoutMs + maxDelayMs) ` +
        `= ${publishBudgetMs} ms), that is above ${2 * publishBudgetMs} ms`,
    );
  }
  const expiredGraceMs = options.expiredGraceMs ?? CLAIM_CHECK_DEFAULTS.expiredGraceMs;
  positive('claimCheck.expiredGraceMs', expiredGraceMs);
  if (Number.isSafeInteger(expiredGraceMs) && expiredGraceMs > MAX_TTL_MS) {
    problems.push(
      `claimCheck.expiredGraceMs must be at most ${MAX_TTL_MS} (100 years), got ${expiredGraceMs}`,
    );
  }
  positive('claimCheck.sweepBatch', sweepBatch);
  if (ttlMs === 0) problems.push('claimCheck.ttlMs must be above 0');
  if (sweepBatch === 0) problems.push('claimCheck.sweepBatch must be above 0');
  if (sweepIntervalMs !== false) positive('claimCheck.sweepIntervalMs', sweepIntervalMs);
  // setInterval(…, 0) would sweep the stores back to back, forever.
  if (sweepIntervalMs === 0) {
    problems.push('claimCheck.sweepIntervalMs must be above 0 (or false to turn the sweeper off)');
  }
  // Past MAX_TIMER_MS Node fires the interval after 1 ms instead: the same hot loop.
  if (
    sweepIntervalMs !== false &&
    Number.isSafeInteger(sweepIntervalMs) &&
    sweepIntervalMs > MAX_TIMER_MS
  ) {
    problems.push(
      `claimCheck.sweepIntervalMs must be at most ${MAX_TIMER_MS} ms (the longest a timer ` +
        `waits), got ${sweepIntervalMs}; use false to turn the sweeper off`,
    );
  }
  const deleteAfter = options.deleteAfter ?? CLAIM_CHECK_DEFAULTS.deleteAfter;
  const retentionProblem = claimRetentionProblem(deleteAfter);
  if (retentionProblem) problems.push(`claimCheck.deleteAfter ${retentionProblem}`);

  let keyring: ClaimTicketKeyring | undefined;
  const ephemeralKeys = options.signingKeys === undefined;
  try {
    keyring = new ClaimTicketKeyring(
      options.signingKeys ?? [
        { id: `ephemeral-${randomBytes(4).toString('hex')}`, secret: randomBytes(32) },
      ],
    );
  } catch (error) {
    if (!(error instanceof SequenceOptionsError)) throw error;
    problems.push(...error.problems.map((problem) => `claimCheck.signingKeys: ${problem}`));
  }

  const owned: Array<{ close(): Promise<void> }> = [];
  let store = options.store;
  if (!store) {
    store = new FilesystemPayloadStore();
    owned.push(store);
  }
  const ledger = options.ledger ?? new MemoryClaimLedger();
  if (!options.ledger) owned.push(ledger);
  const wrap = (inner: PayloadStore): PayloadStore =>
    options.encryption ? new EncryptingPayloadStore(inner, options.encryption) : inner;
  const stores = new Map<string, PayloadStore>();
  for (const candidate of [store, ...(options.readStores ?? [])]) {
    if (typeof candidate.name !== 'string' || !STORE_NAME_PATTERN.test(candidate.name)) {
      // Every ticket names its store: one that no ticket can carry would store payloads whose
      // tickets then fail to sign.
      problems.push(
        `claimCheck: payload store name ${JSON.stringify(candidate.name)} cannot travel in a ` +
          'ticket; use 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit',
      );
      continue;
    }
    if (stores.has(candidate.name)) {
      problems.push(
        `claimCheck: two payload stores are named ${JSON.stringify(candidate.name)}; tickets ` +
          'name their store, so names must differ',
      );
      continue;
    }
    try {
      stores.set(candidate.name, wrap(candidate));
    } catch (error) {
      if (!(error instanceof SequenceOptionsError)) throw error;
      problems.push(...error.problems.map((problem) => `claimCheck.encryption: ${problem}`));
      break;
    }
  }

  if (problems.length > 0 || !keyring) {
    throw new SequenceOptionsError('SequenceModule claimCheck options', problems);
  }
  return {
    store: stores.get(store.name) ?? store,
    stores,
    ledger,
    keyring,
    ephemeralKeys,
    threshold,
    maxInlineBytes,
    sequenceMaxBytes,
    ttlMs,
    orphanGraceMs,
    expiredGraceMs,
    sweepIntervalMs,
    sweepBatch,
    deleteAfter,
    maxStoreRequeues,
    owned,
  };
}

/** The longest ticket life: its expiry (now + ttlMs) must stay an exact number of milliseconds. */
export const MAX_TTL_MS = 100 * 365 * 24 * 60 * 60 * 1000;

/** What is wrong with a retention setting, or undefined. */
export function claimRetentionProblem(retention: unknown): string | undefined {
  if (retention === 'ack' || retention === 'ttl') return undefined;
  if (typeof retention === 'object' && retention !== null) {
    const consumers = (retention as { consumers?: unknown }).consumers;
    if (typeof consumers === 'number' && Number.isSafeInteger(consumers) && consumers >= 1) {
      return undefined;
    }
  }
  return `must be 'ack', 'ttl' or { consumers: N } with N ≥ 1, got ${JSON.stringify(retention)}`;
}
