/**
 * What the Claim Check benchmark (claim-check.bench.ts) and its child processes
 * (claim-check.child.ts) say to each other over IPC, on top of what every benchmark child says
 * (harness/child-protocol.ts: `ready`, `error`; stopped by SIGTERM). Every child plays one role
 * per process, so that the peak RSS it reports is that role's own.
 */
import type { ChildReady } from './harness/child-protocol';
import type { EpochMs, GcTally, PeakReading } from './harness/measure';

/**
 * - `writer` (baseline): writes the generated stream to a plain file, hashing it as it goes.
 * - `reader` (baseline): reads that file back through a stream and hashes it.
 * - `sender` (module): `ClaimCheckService.publish` of the generated stream.
 * - `receiver` (module): a `@ClaimCheck` handler reading `payload.stream()` to the end.
 */
export type ChildRole = 'writer' | 'reader' | 'sender' | 'receiver';

/** Passed to a child as its only argument, JSON-encoded. */
export interface ChildConfig {
  readonly role: ChildRole;
  /** Hex seed of the generated payload: every child that generates it makes the same bytes. */
  readonly seed: string;
  /** Size of each generated chunk (a fresh Buffer each). */
  readonly chunkBytes: number;
  /** sender, receiver: the FilesystemPayloadStore's root (the same directory for both). */
  readonly storeRoot: string;
  /** sender, receiver */
  readonly amqpUrl: string;
  /** sender, receiver: the claim check channel (queue), unique to this run of the benchmark. */
  readonly queue: string;
  /** sender, receiver: id of the ticket signing key; its secret is in the environment. */
  readonly signingKeyId: string;
  /** sender, receiver: the transport's `unsafeSocketTricks`. */
  readonly unsafeSocketTricks: boolean;
  /** How often the child samples its RSS. */
  readonly rssSampleMs: number;
}

/** Environment variable that carries the ticket signing secret (hex) to sender and receiver. */
export const SIGNING_SECRET_ENV = 'BENCH_CC_SIGNING_SECRET';

/** Parent → child. */
export type ToChild =
  /** A run is about to start: reset the CPU counter, the memory peak and the marks. */
  | { readonly type: 'arm'; readonly run: string; readonly bytes: number }
  /** writer: write the run's payload to `path`. */
  | { readonly type: 'write'; readonly run: string; readonly path: string }
  /** sender: publish the run's payload through the claim check. */
  | { readonly type: 'send'; readonly run: string }
  /** reader: read `path` to the end and check it against `sha256` and `bytes`. */
  | {
      readonly type: 'read';
      readonly run: string;
      readonly path: string;
      readonly sha256: string;
      readonly bytes: number;
    };

/**
 * What a child measured during one run, from `arm` to its `settled`: its peak RSS since `arm`
 * (sampled every `rssSampleMs`, and the kernel's VmHWM) and what the peak was made of, and:
 */
export interface ChildFigures extends PeakReading {
  /** CPU seconds (user + system) the child used since `arm`. */
  readonly cpuSeconds: number;
  /** Named instants of the run as this child saw them (see each role for the names). */
  readonly marks: Readonly<Record<string, EpochMs>>;
  /** Chunks the reading side received (reader, receiver). */
  readonly chunks?: number;
  /** Minor page faults since `arm`: memory the process touched for the first time (or again). */
  readonly minorFaults: number;
  /** Garbage collections since `arm` by kind (scavenge, mark-compact, ...): count and pause ms. */
  readonly gc: Readonly<GcTally>;
}

/** Child → parent. */
export type FromChild =
  /** Started (and connected); `idleRssMiB` is its RSS then, before any run. */
  | ChildReady
  | { readonly type: 'armed'; readonly run: string }
  /**
   * writer, sender: every byte is stored (writer: the file is closed; sender: `publish`
   * resolved, so the ticket is confirmed). `ref` is the file path or the payload's ref.
   */
  | {
      readonly type: 'stored';
      readonly run: string;
      readonly bytes: number;
      readonly sha256: string;
      readonly ref: string;
    }
  /** reader, receiver: every byte was read and matched the SHA-256: the clock stops here. */
  | { readonly type: 'done'; readonly run: string; readonly bytes: number }
  /** The child's part of the run is over (reader, receiver: the payload is deleted). */
  | { readonly type: 'settled'; readonly run: string; readonly figures: ChildFigures };
