/**
 * What the RabbitMQ benchmark (the producer, sequence-rabbitmq.bench.ts) and its consumer
 * processes (sequence-rabbitmq.consumer.ts) tell each other over the fork IPC channel, on top of
 * what every benchmark child says (harness/child-protocol.ts: `ready`, `error`; stopped by
 * SIGTERM).
 */
import type { ChildReady } from './harness/child-protocol';
import type { EpochMs, PeakReading } from './harness/measure';

/**
 * How a consumer process consumes: the broker's plain client (a), or the module with the Redis
 * store (b).
 */
export type ConsumerMode = 'raw' | 'module';

/** The broker a run goes through (`BENCH_TRANSPORT`). */
export type BenchTransport = 'rabbitmq' | 'nats';

/** Passed to a consumer process as its only argument, JSON-encoded. */
export interface ConsumerConfig {
  readonly mode: ConsumerMode;
  readonly transport: BenchTransport;
  /** The broker's URL. */
  readonly url: string;
  /** The queue (RabbitMQ) or subject (NATS) to consume. */
  readonly queue: string;
  readonly prefetch: number;
  /** module mode only */
  readonly redisUrl: string;
  /** module mode only: the store's key prefix, unique to this run of the benchmark */
  readonly redisPrefix: string;
  /** module mode only: the store's `readAhead` (pieces); undefined keeps the store's default */
  readonly readAhead?: number;
  /** module mode only: the transport's (RabbitMQ) and the store's `unsafeSocketTricks` */
  readonly unsafeSocketTricks: boolean;
  /** module mode only: the store's encryption key (base64), when the variant encrypts */
  readonly encryptionKey?: string;
  /** How often the consumer samples its RSS. */
  readonly rssSampleMs: number;
  /** module mode only: `sequence.buffer`, and with `'broker'` the partitions and window */
  readonly buffer: 'store' | 'broker';
  readonly partitions: number;
  readonly window: number;
}

/** Producer → consumer: a run is about to start: reset the counters and the memory peak. */
export interface ToConsumer {
  readonly type: 'arm';
  readonly run: string;
  /** What the run sends. */
  readonly bytes: number;
}

/** Where one module-mode run spent its time, seen from the consumer (module mode only). */
export interface ModuleTrace {
  readonly firstAcceptAt?: EpochMs;
  /** When the accept that completed the sequence resolved. */
  readonly completeAt?: EpochMs;
  /**
   * The read before the handler: SequenceDelivery's SHA-256 check (absent when the sequence
   * was verified as it arrived, in order, on one consumer).
   */
  readonly verifyStartAt?: EpochMs;
  readonly verifyEndAt?: EpochMs;
  /** The handler's payload.stream(). */
  readonly handlerStartAt?: EpochMs;
  readonly handlerEndAt?: EpochMs;
  readonly finishEndAt?: EpochMs;
  readonly accepts: number;
  /** Passes over the sequence's bytes in the store (1 when verified at intake, else 2). */
  readonly reads: number;
  /** Sum of the durations of every accept call (they overlap up to `prefetch` at a time). */
  readonly acceptMs: number;
  readonly maxConcurrentAccepts: number;
  /** Redis commands this consumer sent, by command (scripts by name), as its client saw them. */
  readonly redis: Readonly<Record<string, RedisCommandTally>>;
}

export interface RedisCommandTally {
  calls: number;
  /** Sum of client-side latencies (send → reply), overlapping. */
  ms: number;
  /** Bytes of Buffer arguments sent (bodies). */
  bytesOut: number;
}

/** Consumer → producer. */
export type FromConsumer =
  /**
   * Started and connected (`idleRssMiB`: its RSS then, before any message), with the prefetch
   * its subscription uses (the module's: as the library lowers it for bytes).
   */
  | ChildReady<{ readonly prefetch: number }>
  | { readonly type: 'armed'; readonly run: string }
  /** Every byte of the run was consumed (a) or read by the handler (b): the clock stops here. */
  | { readonly type: 'done'; readonly run: string; readonly bytes: number }
  /**
   * The run is settled (acked, finished); its figures: the peak RSS since `arm` (sampled every
   * `rssSampleMs`, and the kernel's VmHWM) and what it was made of, the CPU seconds since `arm`.
   */
  | ({
      readonly type: 'settled';
      readonly run: string;
      readonly cpuSeconds: number;
      readonly trace?: ModuleTrace;
    } & PeakReading);
