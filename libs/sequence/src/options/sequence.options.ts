import type { PayloadEncryptionKey } from '../core/encryption-key';
import type { ExpiredSequence, SequenceStore } from '../ports/sequence-store.port';
import type { RetryPolicy } from './module-options';

/**
 * How one channel's sequences are reassembled: what `@SequencedHandler` (and a `@ClaimCheck`'s
 * `sequence`) may set for its own channel, over the module's `sequence` options.
 */
export interface SequenceLimitOptions {
  /** How long an incomplete sequence may wait for its missing fragments. @default 300000 */
  timeoutMs?: number;
  /**
   * `'fixed'`: `timeoutMs` from the first fragment stored; `'sliding'`: from the latest one.
   * @default 'fixed'
   */
  timeoutStrategy?: 'fixed' | 'sliding';
  /** Largest reassembled payload. @default 536870912 (512 MiB) */
  maxSequenceBytes?: number;
  /** Most fragments per sequence. @default 100000 */
  maxFragments?: number;
  /** Largest fragment body accepted; larger ones are dead-lettered. @default the transport's maxMessageBytes */
  maxFragmentBytes?: number;
  /**
   * Largest user headers (the producer's own, wire-contract headers aside) a fragment may carry,
   * measured as the store keeps them: their JSON, in UTF-8 bytes. A sequence keeps its first
   * fragment's headers and they count against `maxBufferedBytes`; a fragment over this is
   * dead-lettered `headers-too-large`. @default 16384
   */
  maxHeaderBytes?: number;
}

/** What a `@SequencedHandler` may set for its own channel. */
export interface SequenceConsumerOptions extends SequenceLimitOptions {
  /** Retries of a failing handler before the sequence is dead-lettered. @default the module's handlerRetry */
  handlerRetry?: RetryPolicy;
  /**
   * Longest one call of this handler may run before it is abandoned: its `AbortSignal` is
   * aborted, the call counts as failed under `handlerRetry`, and what it returns later is
   * ignored. `false`: no limit, whatever the module's. @default the module's handlerTimeoutMs (none)
   */
  handlerTimeoutMs?: number | false;
  /** Unsettled messages in this consumer's hands at once; see `prefetchBytes`. @default the module's prefetch */
  prefetch?: number;
  /**
   * Fragment bytes a sequence consumer may have in its hands at once: its prefetch is lowered to
   * `floor(prefetchBytes / maxFragmentBytes)`, at least 1. The completing fragment stays
   * unsettled while the handler runs, so this also bounds how many handlers run at once.
   * @default 33554432 (32 MiB)
   */
  prefetchBytes?: number;
  /** Where refused fragments and expiry records go. @default the transport's `<channel>.dlq` */
  deadLetterChannel?: string;
  /**
   * Where fragments wait for the rest of their sequence:
   * - `'store'`: in the sequence store, each acked once stored; any instance may take any
   *   fragment.
   * - `'broker'`: unacknowledged in the broker, each partition of the channel consumed by one
   *   instance at a time, the bodies spooled to a local file; only the completion marker goes to
   *   the store. Needs a transport with partitioned channels, and producers that send with
   *   `buffer: 'broker'` and the same `partitions`. See docs/message-sequence.md.
   * @default the module's `sequence.buffer`, `'store'`
   */
  buffer?: 'store' | 'broker';
  /** Partitions of the channel with `buffer: 'broker'`. @default the module's `sequence.partitions`, 4 */
  partitions?: number;
  /**
   * With `buffer: 'broker'`: fragments each partition may hold unacknowledged at once, the
   * broker's prefetch per partition. A sequence that declares more fragments, or a partition
   * whose window fills up before any of its sequences completes, goes through the store instead.
   * @default the module's `sequence.window`, 1024
   */
  window?: number;
}

/** The local files where broker-held sequences' bodies wait (`buffer: 'broker'`). */
export interface SpoolOptions {
  /**
   * A directory of this host's disk; each process spools in a directory of its own under it
   * (`<pid>-<8 hex digits>`), and removes only such directories of processes that are gone.
   * @default `<os tmpdir>/nest-sequence-spool`
   */
  dir?: string;
  /**
   * Most bytes this process spools at once. A sequence that would go beyond (or meets a full
   * disk) goes through the store instead. @default 4294967296 (4 GiB)
   */
  maxBytes?: number;
}

/** Message Sequence options: `SequenceModule.forRoot({ sequence })`. */
export interface MessageSequenceOptions extends SequenceLimitOptions {
  /**
   * Where fragments wait for the rest of their sequence; shared by every instance consuming a
   * channel. @default the `stores` preset's, else a MemorySequenceStore (one process)
   */
  store?: SequenceStore;
  /**
   * Largest fragment body `SplitterService` sends.
   * @default the transport's maxMessageBytes minus tuning.headerAllowanceBytes
   */
  fragmentBytes?: number;
  /** See {@link SequenceConsumerOptions.prefetchBytes}. @default 33554432 (32 MiB) */
  prefetchBytes?: number;
  /** Where refused fragments and expiry records of every channel go. @default each channel's `<channel>.dlq` */
  deadLetterChannel?: string;
  /**
   * Store-wide ceiling of budget bytes held for open sequences: their bodies (declared bytes are
   * reserved when a sequence opens), the headers each keeps, and a fixed overhead per sequence
   * (1 KiB) and per fragment (256 bytes). @default 1073741824 (1 GiB)
   */
  maxBufferedBytes?: number;
  /**
   * Budget one channel's open sequences may hold, so that one channel — or a producer declaring
   * large sequences on it — cannot starve the others. At the limit, that channel's new sequences
   * are back-pressured; the others go on.
   * @default three quarters of maxBufferedBytes, or room for one sequence of maxSequenceBytes if that is more (at most maxBufferedBytes)
   */
  maxChannelBufferedBytes?: number;
  /** Store-wide ceiling of open sequences. @default 10000 */
  maxOpenSequences?: number;
  /** How long finished sequences' markers (and failed sequences' fragments) are kept. @default 3600000 */
  retentionMs?: number;
  /** Called once per expired sequence, by the instance that expired it. */
  onExpired?: (expired: ExpiredSequence) => void | Promise<void>;
  /**
   * AES-256-GCM encryption of the default (memory) store's bodies and user headers: the first key
   * encrypts, all decrypt. A store you pass encrypts with its own `encryption` option
   * (`redis(url, { encryption })`); see docs/security.md. @default none
   */
  encryption?: { keys: PayloadEncryptionKey[] };
  /** See {@link SequenceConsumerOptions.buffer}; also what `send` uses by default. @default 'store' */
  buffer?: 'store' | 'broker';
  /** See {@link SequenceConsumerOptions.partitions}; also what `send` uses by default. @default 4 */
  partitions?: number;
  /** See {@link SequenceConsumerOptions.window}. @default 1024 */
  window?: number;
  /** Where broker-held sequences are spooled. */
  spool?: SpoolOptions;
}
