import type { Registry } from 'prom-client';
import type { ClaimTicketKeyring } from '../core/claim-ticket-keyring';
import type { GapEvent } from '../core/gap-event';
import type { RejectionCode } from '../core/errors/rejection-code';
import type { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import type { BoxName } from '../ports/outbox-store.port';
import type { GapPolicy, ResequencedEntry } from '../ports/resequencer-store.port';
import type { ExpiredSequence, ExpiryPolicy } from '../ports/sequence-store.port';
import type { ClaimRetention } from './claim-check.options';
import type { OverflowPolicy, ResequencerField } from './resequencer.options';

// The options with every default applied and every value checked: what the module's services
// read. Built once, at bootstrap, by resolveModuleOptions (and, per handler, by the resolvers of
// each decorator's options).

export interface ResolvedRetryPolicy {
  readonly attempts: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
}

export interface ResolvedPublishPolicy {
  readonly confirmTimeoutMs: number;
  readonly inFlight: number;
  readonly retry: ResolvedRetryPolicy;
}

export interface ResolvedSweeper {
  readonly intervalMs: number | false;
  readonly batchSize: number;
}

export interface ResolvedTuning {
  readonly headerAllowanceBytes: number;
  readonly backpressureDelayMs: number;
  readonly leaseMs: number;
  readonly storeTimeoutMs: number;
  readonly maxStoreRequeues: number;
  readonly drain: { readonly batchSize: number; readonly waitMs: number };
  readonly sweepers: {
    readonly expiry: ResolvedSweeper;
    readonly orphans: ResolvedSweeper;
    readonly gaps: ResolvedSweeper;
    readonly purge: ResolvedSweeper;
  };
}

/** How one channel's sequences are reassembled (a handler's options over the module's). */
export interface ResolvedSequenceConsumer {
  readonly timeout: ExpiryPolicy;
  readonly maxSequenceBytes: number;
  readonly maxFragments: number;
  readonly maxFragmentBytes: number;
  readonly maxHeaderBytes: number;
  readonly handlerRetry: ResolvedRetryPolicy;
  /** `undefined`: no limit. */
  readonly handlerTimeoutMs: number | undefined;
  readonly prefetch: number;
  readonly prefetchBytes: number;
  readonly deadLetterChannel?: string;
  readonly buffer: 'store' | 'broker';
  readonly partitions: number;
  readonly window: number;
}

export interface ResolvedSequenceOptions {
  readonly fragmentBytes: number;
  readonly maxBufferedBytes: number;
  readonly maxChannelBufferedBytes: number;
  readonly maxOpenSequences: number;
  readonly retentionMs: number;
  readonly onExpired?: (expired: ExpiredSequence) => void | Promise<void>;
  /** What a `@SequencedHandler` that sets nothing gets. */
  readonly consumer: ResolvedSequenceConsumer;
  readonly spool: { readonly dir: string; readonly maxBytes: number };
}

export interface ResolvedClaimCheckOptions {
  readonly keyring: ClaimTicketKeyring;
  /** The signing keys were generated at boot (not given). */
  readonly ephemeralKeys: boolean;
  readonly inlineMaxBytes: number;
  /** The largest payload one message of the transport carries inline: `inlineMaxBytes`'s ceiling. */
  readonly maxInlineBytes: number;
  readonly sequenceMaxBytes: number;
  readonly ttlMs: number;
  readonly orphanGraceMs: number;
  readonly expiredGraceMs: number;
  readonly deleteAfter: ClaimRetention;
  /** Consumers take tickets that name no channel (`v: 1`, from earlier releases). */
  readonly acceptTicketsWithoutAudience: boolean;
  /** Longest wait on a payload store for one step of a read (head, open, next chunk). */
  readonly readTimeoutMs: number;
  /** Longest a payload store may hold an upload up (see payload-upload.ts). */
  readonly writeTimeoutMs: number;
}

/** A `@ClaimCheck` handler's options over the module's. */
export interface ResolvedClaimCheckConsumer {
  readonly deleteAfter: ClaimRetention;
  readonly handlerRetry: ResolvedRetryPolicy;
  readonly handlerTimeoutMs: number | undefined;
  readonly prefetch: number;
  readonly deadLetterChannel?: string;
  /** For payloads that arrive as a Message Sequence. */
  readonly sequence: ResolvedSequenceConsumer;
}

export interface ResolvedResequencerOptions {
  readonly maxBufferedPerKey: number;
  readonly maxBufferedTotal: number;
  readonly maxBufferedBytesPerKey: number;
  readonly maxBufferedBytesTotal: number;
  readonly maxSeqAhead?: number;
  readonly overflow: OverflowPolicy;
  readonly onGap?: (event: GapEvent) => void | Promise<void>;
}

/** One resequencer with every default applied; what the runtime reads. */
export interface ResolvedResequencer {
  readonly name: string;
  readonly channel: string;
  readonly key: ResequencerField<string>;
  readonly seq: ResequencerField<number>;
  readonly output?: string;
  readonly outputInFlight: number;
  readonly callHandler: boolean;
  readonly start: number;
  readonly gap: { readonly timeoutMs: number; readonly policy: GapPolicy };
  readonly maxBufferedPerKey: number;
  readonly maxBufferedBytesPerKey: number;
  /** `resequencer.maxBufferedBytesTotal`, or what the definer set (stream mode: its store budget). */
  readonly maxBufferedBytesTotal: number;
  /** None: no bound (see `ResequencerLimits.maxSeqAhead`). */
  readonly maxSeqAhead?: number;
  readonly overflow: OverflowPolicy;
  readonly handlerRetry: ResolvedRetryPolicy;
  readonly handlerTimeoutMs: number | undefined;
  readonly prefetch: number;
  readonly deadLetterChannel: string;
  /**
   * Set by a definer (stream mode): once a gap's events are dead-lettered, the key is closed and
   * every later event of it is dead-lettered with this code, never released.
   */
  readonly closeAfterDeadLetter?: RejectionCode;
  /** Set by a definer (stream mode): keys that end, retired once drained (see `IntakeBounds`). */
  readonly retire?: KeyRetirement;
  /** Set by a definer (stream mode): told of the dead letters the handler never sees. */
  readonly deadLettered?: DeadLetterListener;
  /** Set by a definer (stream mode): told of the handler's refusals once dead-lettered. */
  readonly refused?: DeadLetterListener;
}

/** A resequencer's keys that come to an end, and how long an ended key's state is kept. */
export interface KeyRetirement {
  readonly afterMs: number;
  /** Whether event `entry` of `key`, handed over (delivered or dead-lettered), ends the key. */
  ends(key: string, entry: ResequencedEntry): boolean;
  /** Told once the store let `key` go early: its state expires at `until` (epoch ms). */
  retired?(key: string, until: number): void;
}

/** Told of an event of `key` that a resequencer dead-lettered itself, with its reason. */
export type DeadLetterListener = (
  key: string,
  seq: number,
  code: RejectionCode,
  detail: string,
) => void;

export interface ResolvedBoxOptions {
  /** `undefined` for an inbox left to decide by its handlers. */
  readonly enabled: boolean | undefined;
  readonly pollIntervalMs: number;
  readonly batchSize: number;
  readonly concurrency: number;
  readonly retry: ResolvedRetryPolicy;
  readonly ordered: boolean;
  readonly retentionMs: number | false;
  /** Inboxes: the prefetch of their channels (1 when ordered). */
  readonly prefetch: number;
}

export interface ResolvedOutboxOptions {
  /** Whether the app asked for the outbox (an `outbox` option): then it starts at bootstrap. */
  readonly configured: boolean;
  readonly migrate: boolean;
  readonly serviceName?: string;
  readonly routeEvent: (event: OutboxEvent) => readonly string[];
  readonly routeCommand: (command: OutboxCommand) => string;
  readonly boxes: Readonly<Record<BoxName, ResolvedBoxOptions>>;
}

/** `tracing`, resolved: `enabled` false for `tracing: false`. */
export interface ResolvedTracing {
  readonly enabled: boolean;
  readonly parent: 'link' | 'child';
  readonly maxLinks: number;
}

/** Every module option, resolved. */
export interface ResolvedOptions {
  readonly consumerId: string;
  readonly publish: ResolvedPublishPolicy;
  readonly handlerRetry: ResolvedRetryPolicy;
  /** What a handler that sets none gets; `undefined`: no limit. */
  readonly handlerTimeoutMs: number | undefined;
  readonly prefetch: number;
  readonly shutdownTimeoutMs: number;
  readonly metrics: false | { readonly registry?: Registry; readonly prefix: string };
  readonly tracing: ResolvedTracing;
  readonly tuning: ResolvedTuning;
  readonly sequence: ResolvedSequenceOptions;
  readonly claimCheck: ResolvedClaimCheckOptions;
  readonly resequencer: ResolvedResequencerOptions;
  readonly outbox: ResolvedOutboxOptions;
}
