import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** Options of {@link FilesystemPayloadStore}. */
export interface FilesystemPayloadStoreOptions {
  /**
   * The directory that holds the payloads; created (with its parents) on first use. Nothing is
   * ever read or written outside it.
   * @default join(os.tmpdir(), 'nest-sequence-payloads')
   */
  readonly root?: string;
  /**
   * `fsync` each payload, its metadata and their directory before `put` resolves, so that a
   * stored payload survives a power loss, at the cost of throughput.
   * @default false
   */
  readonly fsync?: boolean;
  /**
   * Temporary files (and metadata without a payload) not modified for this long are left over
   * from a crashed process; `sweepCandidates` removes those it walks past. Keep it well above the
   * longest pause a put's source may take: a stalled put older than this loses its temporary file
   * and fails.
   * @default 3_600_000 (one hour)
   */
  readonly staleTemporaryMs?: number;
}

export const DEFAULT_FILESYSTEM_PAYLOAD_ROOT = join(tmpdir(), 'nest-sequence-payloads');

export const DEFAULT_STALE_TEMPORARY_MS = 3_600_000;
