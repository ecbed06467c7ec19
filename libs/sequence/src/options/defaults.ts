const KiB = 1024;
const MiB = 1024 * KiB;
const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/**
 * The one home of the module's defaults: every option left out takes its value from here
 * (`resolveModuleOptions`), and the doc comments' `@default`s say the same.
 */
export const DEFAULTS = {
  prefetch: 16,
  shutdownTimeoutMs: 10_000,
  metricsPrefix: 'nest_sequence_',
  tracing: { parent: 'link', maxLinks: 32 },
  publish: {
    confirmTimeoutMs: 10_000,
    inFlight: 2,
    retry: { attempts: 5, baseDelayMs: 100, maxDelayMs: 5_000 },
  },
  handlerRetry: { attempts: 3, baseDelayMs: 200, maxDelayMs: 30_000 },
  /** No limit: see `handlerTimeoutMs` in module-options.ts. */
  handlerTimeoutMs: undefined as number | undefined,
  sequence: {
    timeoutMs: 300_000,
    timeoutStrategy: 'fixed',
    maxSequenceBytes: 512 * MiB,
    maxFragments: 100_000,
    maxHeaderBytes: 16 * KiB,
    prefetchBytes: 32 * MiB,
    maxBufferedBytes: 1024 * MiB,
    maxOpenSequences: 10_000,
    retentionMs: HOUR,
    buffer: 'store',
    partitions: 4,
    window: 1024,
    spoolMaxBytes: 4096 * MiB,
  },
  claimCheck: {
    inlineMaxBytes: 256 * KiB,
    sequenceMaxBytes: 64 * MiB,
    ttlMs: 24 * HOUR,
    expiredGraceMs: 5 * MINUTE,
    orphanGraceMs: HOUR,
    deleteAfter: 'ack',
    acceptTicketsWithoutAudience: false,
    readTimeoutMs: 30_000,
    writeTimeoutMs: 5 * MINUTE,
  },
  resequencer: {
    maxBufferedPerKey: 1_000,
    maxBufferedTotal: 100_000,
    maxBufferedBytesPerKey: 16 * MiB,
    maxBufferedBytesTotal: 256 * MiB,
    overflow: 'backpressure',
    start: 1,
    outputInFlight: 1,
  },
  outbox: {
    migrate: true,
    outboxes: { pollIntervalMs: 5_000, batchSize: 100, concurrency: 3 },
    inboxes: { pollIntervalMs: 2_000, batchSize: 16, concurrency: 1, prefetch: 32 },
    retry: { attempts: 10, baseDelayMs: 1_000, maxDelayMs: 300_000 },
    ordered: false,
    retentionMs: 7 * 24 * HOUR,
  },
  tuning: {
    headerAllowanceBytes: 16 * KiB,
    backpressureDelayMs: 500,
    leaseMs: 30_000,
    storeTimeoutMs: 30_000,
    maxStoreRequeues: 1_200,
    drain: { batchSize: 32, waitMs: 2_000 },
    sweepers: {
      expiry: { intervalMs: 1_000, batchSize: 100 },
      orphans: { intervalMs: MINUTE, batchSize: 500 },
      gaps: { intervalMs: 1_000, batchSize: 100 },
      purge: { intervalMs: MINUTE, batchSize: 500 },
    },
  },
} as const;
