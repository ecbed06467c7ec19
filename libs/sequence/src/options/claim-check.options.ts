import type { ClaimTicketKey } from '../core/claim-ticket-keyring';
import type { PayloadEncryptionKey } from '../core/encryption-key';
import type { ClaimLedger } from '../ports/claim-ledger.port';
import type { PayloadStore } from '../ports/payload-store.port';
import type { RetryPolicy } from './module-options';
import type { SequenceLimitOptions } from './sequence.options';

/**
 * When a claimed payload is deleted, per consuming channel:
 * - `'ack'`: one consumer group; deleted once its handler succeeded (then the message is acked).
 * - `'ttl'`: fan-out to groups the sender does not count; deleted by the sweeper at expiry.
 * - `{ consumers: N }`: fan-out to N known groups; deleted once N distinct groups succeeded.
 */
export type ClaimRetention = 'ack' | 'ttl' | { readonly consumers: number };

/** Claim Check options: `SequenceModule.forRoot({ claimCheck })`. */
export interface ClaimCheckOptions {
  /**
   * Where payloads are parked.
   * @default the `stores` preset's, else a FilesystemPayloadStore under `<os tmpdir>/nest-sequence-payloads`
   */
  store?: PayloadStore;
  /** More stores tickets may name (read, release and sweep only), e.g. while migrating. */
  readStores?: PayloadStore[];
  /**
   * Records which consumer groups handled which ticket: a ticket delivered twice runs its handler
   * once, and `deleteAfter: { consumers }` counts groups. Must be shared by every instance
   * consuming a channel. @default the `stores` preset's, else a MemoryClaimLedger (one process)
   */
  ledger?: ClaimLedger;
  /**
   * HMAC keys for tickets: the first signs, all verify (rotation). Required as soon as tickets
   * cross processes. @default one random key per process (tickets only verify in that process)
   */
  signingKeys?: ClaimTicketKey[];
  /** AES-256-GCM encryption of parked payloads: the first key encrypts, all decrypt. @default none */
  encryption?: { keys: PayloadEncryptionKey[] };
  /**
   * `ClaimCheckService.publish()` sends payloads up to this many bytes inline.
   * @default 262144 (256 KiB), or less when one message of the transport carries less
   */
  inlineMaxBytes?: number;
  /** `publish(..., { mode: 'auto' })` sends payloads up to this size as a Message Sequence. @default 67108864 (64 MiB) */
  sequenceMaxBytes?: number;
  /** How long a checked-in payload (and its ticket) stays valid. @default 86400000 (24 h) */
  ttlMs?: number;
  /**
   * How long after its expiry the sweeper keeps a payload, for handlers still reading it: keep it
   * above the longest handler run on one delivery plus the clock skew between instances. The
   * Redis payload store drops its keys at `expiresAt + keyTtlMarginMs`: a grace above that
   * margin is refused at boot. @default 300000 (5 min)
   */
  expiredGraceMs?: number;
  /**
   * How long a payload stored for `publish()` may wait for its ticket's confirm before the
   * sweeper takes it for an orphan. @default 3600000 (1 h)
   */
  orphanGraceMs?: number;
  /** Default retention of consuming channels. @default 'ack' */
  deleteAfter?: ClaimRetention;
  /**
   * Longest a payload store may take over one step of reading a payload: answering for its
   * metadata, opening it, or handing over its next chunk (the time a handler spends on a chunk
   * does not count). Past it the read fails with `PayloadReadTimeoutError` and what it opened is
   * destroyed; the message is requeued as for a store outage, then dead-lettered
   * `store-unavailable` after `tuning.maxStoreRequeues`. Raise it for a store whose first byte
   * may come slowly. It also bounds each `markPublished` and `delete`, a consumer's or a
   * publish's (`PayloadStoreTimeoutError`), which then counts as failed: a delete is left to the
   * sweeper or the payload's expiry, a mark is tried again, and `publish()` waits that long at
   * most for the mark after its ticket's confirm. `release()` rejects with that error.
   * @default 30000 (30 s)
   */
  readTimeoutMs?: number;
  /**
   * Longest a payload store may hold an upload up: take none of the bytes waiting for it, or
   * give no answer once it has them all. Past it the publish, `checkIn` or claim-checked send
   * rejects with `PayloadStoreTimeoutError` (`put`), the source stream is destroyed and no ticket
   * goes out; a payload the store keeps all the same is deleted. Waits on the caller's stream do
   * not count. What the store does with bytes it took counts: a payload given as bytes, up to
   * 8 MiB, is one wait; S3 takes no more while `partsInFlight` parts upload, and finishes the
   * last ones (and the multipart upload) after the end; the filesystem store flushes the file
   * with `fsync`. Keep it above what those take on your slowest link and disk.
   * @default 300000 (5 minutes)
   */
  writeTimeoutMs?: number;
  /**
   * Whether consumers take tickets that name no channel: those of producers on a release before
   * tickets were bound to the channel they were issued for. Off, such a ticket is dead-lettered
   * `claim-ticket-invalid` (`no-audience`), so that a ticket cannot be replayed onto a channel it
   * was not meant for. Turn it on for a rolling upgrade, while old producers' tickets drain, then
   * off again. @default false
   */
  acceptTicketsWithoutAudience?: boolean;
}

/** What a `@ClaimCheck` handler may set for its own channel. */
export interface ClaimCheckConsumerOptions {
  /** When its payloads are deleted. @default claimCheck.deleteAfter ('ack') */
  deleteAfter?: ClaimRetention;
  /** Retries of a failing handler before the message is dead-lettered. @default the module's handlerRetry */
  handlerRetry?: RetryPolicy;
  /**
   * Longest one call of this handler may run before it is abandoned: its `AbortSignal` is
   * aborted, the call counts as failed under `handlerRetry`, and what it returns later is
   * ignored. `false`: no limit, whatever the module's. @default the module's handlerTimeoutMs (none)
   */
  handlerTimeoutMs?: number | false;
  /** Unsettled messages in this consumer's hands at once. @default the module's prefetch */
  prefetch?: number;
  /** Where refused messages go. @default the transport's `<channel>.dlq` */
  deadLetterChannel?: string;
  /**
   * For payloads that arrive as a Message Sequence (`mode: 'auto'`): the expiry and limits of
   * their reassembly. A claim-check channel subscribes with `prefetch` as it is, tickets and
   * fragments alike. @default the module's `sequence` options
   */
  sequence?: SequenceLimitOptions;
}
