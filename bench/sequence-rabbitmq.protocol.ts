/**
 * What the RabbitMQ benchmark (the producer, sequence-rabbitmq.bench.ts) and its consumer
 * processes (sequence-rabbitmq.consumer.ts) tell each other over the fork IPC channel.
 */

/** How a consumer process consumes: plain amqplib (a), or the module with the Redis store (b). */
export type ConsumerMode = 'raw' | 'module';

/** Passed to a consumer process as its only argument, JSON-encoded. */
export interface ConsumerConfig {
  readonly mode: ConsumerMode;
  readonly amqpUrl: string;
  readonly queue: string;
  readonly prefetch: number;
  /** module mode only */
  readonly redisUrl: string;
  /** module mode only: the store's key prefix, unique to this run of the benchmark */
  readonly redisPrefix: string;
  /** module mode only: the store's `readAhead` (pieces); undefined keeps the store's default */
  readonly readAhead?: number;
  /** module mode only: the transport's and the store's `unsafeSocketTricks` */
  readonly unsafeSocketTricks: boolean;
  /** How often the consumer samples its RSS. */
  readonly rssSampleMs: number;
}

/** Producer → consumer. */
export type ToConsumer =
  /** A run is about to start: reset the counters and the memory peak, expect `bytes`. */
  | { readonly type: 'arm'; readonly run: string; readonly bytes: number }
  /** Close everything and exit. */
  | { readonly type: 'stop' };

/** Milliseconds since the epoch, sub-millisecond (performance.timeOrigin + performance.now()). */
export type EpochMs = number;

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
  /** Started and connected; `idleRssMiB` is its RSS then, before any message. */
  | {
      readonly type: 'ready';
      readonly pid: number;
      readonly idleRssMiB: number;
      /** The prefetch its subscription uses (the module's: as the library lowers it for bytes). */
      readonly prefetch: number;
    }
  | { readonly type: 'armed'; readonly run: string }
  /** Every byte of the run was consumed (a) or read by the handler (b): the clock stops here. */
  | { readonly type: 'done'; readonly run: string; readonly bytes: number }
  /** The run is settled (acked, finished); its figures. */
  | {
      readonly type: 'settled';
      readonly run: string;
      /** Peak RSS sampled every `rssSampleMs` since `arm`. */
      readonly peakRssMiB: number;
      /** The kernel's peak RSS (VmHWM) since `arm`, when it could be reset. */
      readonly hwmRssMiB?: number;
      /** When the sampled peak was seen (epoch ms), and the V8 heap and Buffer memory then. */
      readonly peakAt?: number;
      readonly peakHeapMiB?: number;
      /** V8 heap reserved (young and old generations), used or not. */
      readonly peakHeapTotalMiB?: number;
      readonly peakBuffersMiB?: number;
      readonly cpuSeconds: number;
      readonly trace?: ModuleTrace;
    }
  | { readonly type: 'error'; readonly message: string };

/** Current time as {@link EpochMs}. */
export function epochMs(): EpochMs {
  return performance.timeOrigin + performance.now();
}
