import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkInteger, checkOneOf } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';

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
   *
   * It also ages orphan deletes: a payload taken by an orphan delete (`deleteUnpublished`) that
   * did not finish, because its process died, stalled or failed, is finished by a sweep that
   * walks past its claim file once that is this old: deleted if its metadata says unpublished,
   * kept (only the claim removed) if published, left for its expiry if the metadata cannot be
   * read. Until then `markPublished` answers `false` for it. A delete finished this way is not
   * counted by the orphan sweeper's metrics or `claim.deleted` events.
   * @default 3_600_000 (one hour)
   */
  readonly staleTemporaryMs?: number;
}

const FILESYSTEM_PAYLOAD_STORE_KEYS = {
  root: true,
  fsync: true,
  staleTemporaryMs: true,
} as const satisfies OptionKeysOf<FilesystemPayloadStoreOptions>;

export const DEFAULT_FILESYSTEM_PAYLOAD_ROOT = join(tmpdir(), 'nest-sequence-payloads');

export const DEFAULT_STALE_TEMPORARY_MS = 3_600_000;

export type ResolvedFilesystemPayloadStoreOptions = Required<FilesystemPayloadStoreOptions>;

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveFilesystemPayloadStoreOptions(
  options: FilesystemPayloadStoreOptions = {},
): ResolvedFilesystemPayloadStoreOptions {
  const resolved = {
    root: options.root ?? DEFAULT_FILESYSTEM_PAYLOAD_ROOT,
    fsync: options.fsync ?? false,
    staleTemporaryMs: options.staleTemporaryMs ?? DEFAULT_STALE_TEMPORARY_MS,
  };
  const problems: string[] = [];
  checkOptionKeys(problems, options, FILESYSTEM_PAYLOAD_STORE_KEYS);
  // An empty root would resolve to the working directory.
  if (typeof resolved.root !== 'string' || resolved.root.length === 0) {
    problems.push(
      `root must be a directory path, got ${typeof resolved.root === 'string' ? 'an empty string' : String(resolved.root)}`,
    );
  }
  checkOneOf(problems, 'fsync', resolved.fsync, [true, false]);
  checkInteger(problems, 'staleTemporaryMs', resolved.staleTemporaryMs, 1);
  if (problems.length > 0) {
    throw new SequenceOptionsError('FilesystemPayloadStore options', problems);
  }
  return resolved;
}
