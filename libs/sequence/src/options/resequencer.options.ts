import type { PayloadEncryptionKey } from '../core/encryption-key';
import type { GapEvent } from '../core/gap-event';
import type { ResequencerInput } from '../core/resequence-input';
import type { GapPolicy, ResequencerStore } from '../ports/resequencer-store.port';
import type { RetryPolicy } from './module-options';

/** What happens to an event that would be buffered past a bound. */
export type OverflowPolicy = 'backpressure' | 'dead-letter';

/** Resequencer options: `SequenceModule.forRoot({ resequencer })`. */
export interface ResequencerOptions {
  /**
   * Where keys' state lives; shared by every instance.
   * @default the `stores` preset's, else a MemoryResequencerStore (one process)
   */
  store?: ResequencerStore;
  /**
   * Most events held for one key: those buffered behind a gap and those released but not
   * delivered yet (its hand-off list). @default 1000
   */
  maxBufferedPerKey?: number;
  /** Most events buffered per resequencer, all keys together. @default 100000 */
  maxBufferedTotal?: number;
  /**
   * Most bytes held for one key, counted as `maxBufferedPerKey` counts events: each event's
   * body, its headers' names and values, and 64 bytes. @default 16 MiB
   */
  maxBufferedBytesPerKey?: number;
  /** Most bytes buffered per resequencer, all keys together. @default 256 MiB */
  maxBufferedBytesTotal?: number;
  /**
   * Furthest ahead of a key's next expected sequence an event may be buffered: one more than
   * this past it is dead-lettered `invalid-resequence-event`, whatever `overflow` says, so that a
   * sequence number far in the future (a producer's bug) cannot wait in the buffer until a gap
   * policy moves the key past it and leaves every later event of the key late. @default none
   */
  maxSeqAhead?: number;
  /** Over a bound: redeliver later (`tuning.backpressureDelayMs`), or dead-letter. @default 'backpressure' */
  overflow?: OverflowPolicy;
  /** Called for every gap alert, skip and dead-lettered event, by the instance that delivered it. */
  onGap?: (event: GapEvent) => void | Promise<void>;
  /**
   * AES-256-GCM encryption of the default (memory) store's events: the first key encrypts, all
   * decrypt. A store you pass encrypts with its own `encryption` option
   * (`redis(url, { encryption })`); see docs/security.md. @default none
   */
  encryption?: { keys: PayloadEncryptionKey[] };
}

/** How a resequencer finds an event's key or sequence: a header name, or a function of the message. */
export type ResequencerField<T> = string | ((message: ResequencerInput) => T);

/** One resequencer: what `@Resequenced` takes, and `ResequencerService.create`. */
export interface ResequencerDefinition {
  /** The channel (queue) the events arrive on. */
  channel: string;
  /** The resequencer's name: keys of different names never share state. @default channel */
  name?: string;
  /** The event's key. @default the header `x-resequence-key` */
  key?: ResequencerField<string>;
  /** The event's sequence number. @default the header `x-resequence-seq` */
  seq?: ResequencerField<number>;
  /** Publish released events, in order and with confirms, to this channel. */
  output?: string;
  /**
   * Publishes to `output` of one key's released events awaiting their confirms at once. 1 sends
   * each event only once the previous one is confirmed: strict order whatever the broker does.
   * Above 1, a key's events leave in order without waiting for each confirm (faster); the order
   * then still holds unless the broker refuses an event and accepts a later one (see
   * docs/resequencer.md). Only for `output` without the handler; at most
   * `tuning.drain.batchSize`. @default 1
   */
  outputInFlight?: number;
  /** Call the handler with released events. @default true without `output`, false with it */
  callHandler?: boolean;
  /** Each key's first sequence number. @default 1 */
  start?: number;
  /** How long a gap may stay open, and what then. */
  gap: { timeoutMs: number; policy: GapPolicy };
  /** @default the module's `resequencer.maxBufferedPerKey` */
  maxBufferedPerKey?: number;
  /** @default the module's `resequencer.maxBufferedBytesPerKey` */
  maxBufferedBytesPerKey?: number;
  /** @default the module's `resequencer.maxSeqAhead` */
  maxSeqAhead?: number;
  /** @default the module's `resequencer.overflow` */
  overflow?: OverflowPolicy;
  /** Handler calls per event before the event is dead-lettered (the key then moves on). @default the module's handlerRetry */
  handlerRetry?: RetryPolicy;
  /**
   * Longest one handler call may run before it is abandoned: its `AbortSignal` is aborted and the
   * call counts as failed under `handlerRetry`. The key's next call still waits until the
   * abandoned one has returned: two calls for one key never overlap (see docs/resequencer.md).
   * `false`: no limit, whatever the module's. @default the module's handlerTimeoutMs (none)
   */
  handlerTimeoutMs?: number | false;
  /** Unsettled input messages in this consumer's hands at once. @default the module's prefetch */
  prefetch?: number;
  /** Where refused events and gap records go. @default the transport's `<channel>.dlq` */
  deadLetterChannel?: string;
}
