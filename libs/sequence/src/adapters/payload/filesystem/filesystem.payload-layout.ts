import { constants, type Stats } from 'node:fs';
import { type FileHandle, lstat, mkdir, open, realpath } from 'node:fs/promises';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { InvalidPayloadRefError } from '../../../core/errors';

export const FILESYSTEM_STORE_NAME = 'filesystem';

const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';

/** `<yyyy>/<mm>/<dd>/<uuid>`, the day being the payload's expiry day (UTC). Nothing else passes. */
const REF_PATTERN = new RegExp(`^(\\d{4})/(0[1-9]|1[0-2])/(0[1-9]|[12]\\d|3[01])/(${UUID})$`);

export const ID_PATTERN = new RegExp(`^${UUID}$`);
export const YEAR_PATTERN = /^\d{4}$/;
export const MONTH_PATTERN = /^(0[1-9]|1[0-2])$/;
export const DAY_PATTERN = /^(0[1-9]|[12]\d|3[01])$/;

/** The latest expiry a ref can name: the year must fit four digits. */
export const LATEST_EXPIRY = Date.UTC(10_000, 0, 1) - 1;

export const DAY_MS = 86_400_000;

/** What `openOnce` says when another regular file was renamed over the one it opened. */
const REPLACED = Symbol('replaced');
/** Opens of a file that keeps being replaced while it is opened, before it is refused. */
const REPLACED_OPEN_ATTEMPTS = 3;

/** Payloads may hold anything: only the process's own user reads them, even under /tmp. */
export const DIRECTORY_MODE = 0o700;
export const FILE_MODE = 0o600;

/** Where one payload's files live. The payload exists exactly when its `data` file does. */
export interface PayloadFiles {
  readonly ref: string;
  readonly id: string;
  readonly directory: string;
  /** The bytes; renamed into place last, so its presence means the put completed. */
  readonly data: string;
  /** {@link Sidecar} JSON. */
  readonly sidecar: string;
  /** Present while the payload is unpublished: lets sweeps find orphans without reading all. */
  readonly marker: string;
  /**
   * The marker, renamed by `deleteUnpublished` as it takes the payload for an orphan, and removed
   * once the payload is gone (by a sweep once an error or a crash left it stale), never renamed
   * back: a `markPublished` that finds it knows it lost the race.
   */
  readonly deleting: string;
}

export const sidecarName = (id: string): string => `${id}.json`;
export const markerName = (id: string): string => `${id}.unpublished`;
export const deletingName = (id: string): string => `${id}.deleting`;

/** Temporary files start with a dot and end in `.tmp`; nothing else in a day does. */
export const temporaryName = (name: string, unique: string): string => `.${name}.${unique}.tmp`;
export const isTemporaryName = (name: string): boolean =>
  name.startsWith('.') && name.endsWith('.tmp');

/** Start (epoch ms) of a UTC day; `Date.UTC` would read years below 100 as 19xx. */
export function startOfDay(year: number, month: number, day: number): number {
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  return date.getTime();
}

/** The UTC day a payload expiring at `expiresAt` is filed under, as path segments. */
export function daySegments(expiresAt: number): [string, string, string] {
  const date = new Date(expiresAt);
  return [
    String(date.getUTCFullYear()).padStart(4, '0'),
    String(date.getUTCMonth() + 1).padStart(2, '0'),
    String(date.getUTCDate()).padStart(2, '0'),
  ];
}

/**
 * Turns refs into paths under a root whose real path is known, and opens files only when nothing
 * on the way is a symbolic link: refs come from messages, and a link planted in the root must not
 * become a way out of it.
 */
export class FilesystemPayloadLayout {
  /** @param root the real path (`fs.realpath`) of the store's root directory */
  constructor(readonly root: string) {}

  filesFor(ref: string): PayloadFiles {
    const match = REF_PATTERN.exec(ref);
    if (!match) {
      throw this.refused(ref, 'it is not a ref this store generates (<yyyy>/<mm>/<dd>/<uuid>)');
    }
    const [, year, month, day, id] = match;
    const directory = resolve(this.root, year, month, day);
    const data = join(directory, id);
    // The pattern already rules out climbing; this is the second lock on the same door.
    if (!data.startsWith(this.root.endsWith(sep) ? this.root : this.root + sep)) {
      throw this.refused(ref, 'it resolves outside the root');
    }
    return {
      ref,
      id,
      directory,
      data,
      sidecar: join(directory, sidecarName(id)),
      marker: join(directory, markerName(id)),
      deleting: join(directory, deletingName(id)),
    };
  }

  /**
   * Whether a directory under the root exists and is reached without symbolic links (its real
   * path is itself). Throws {@link InvalidPayloadRefError} when a link leads elsewhere.
   */
  async directoryExists(ref: string, directory: string): Promise<boolean> {
    let real: string;
    try {
      real = await realpath(directory);
    } catch (error) {
      if (isMissing(error)) return false;
      throw error;
    }
    if (real !== directory) throw this.refused(ref, 'its path goes through a symbolic link');
    return true;
  }

  /**
   * Creates a directory under the root, and those between, one at a time: each must be a
   * directory, not a symbolic link, before anything is created in it (`mkdir` with `recursive`
   * would create the rest wherever a linked year or month directory leads).
   * @throws InvalidPayloadRefError when a link or another file is on the way
   */
  async makeDirectory(ref: string, directory: string): Promise<void> {
    let current = this.root;
    for (const segment of relative(this.root, directory).split(sep)) {
      current = join(current, segment);
      try {
        await mkdir(current, { mode: DIRECTORY_MODE });
      } catch (error) {
        if (!hasCode(error, 'EEXIST')) throw error;
      }
      const entry = await lstat(current);
      if (entry.isSymbolicLink()) throw this.refused(ref, 'its path goes through a symbolic link');
      if (!entry.isDirectory()) throw this.refused(ref, 'its path holds a file, not a directory');
    }
    // Nothing on the way was a link when it was looked at; this refuses one swapped in since.
    await this.directoryExists(ref, directory);
  }

  /**
   * Opens a regular file of the store for reading, or resolves `undefined` when it is not there.
   * `O_NOFOLLOW` refuses a link as the last component; comparing the opened file with the one at
   * the link-free real path refuses links on the way (and a swap between the check and the open).
   * A regular file renamed over the one being opened (`markPublished` rewrites the metadata that
   * way) is no link and no way out: it is opened again, a few times at most.
   */
  async openFile(ref: string, path: string): Promise<FileHandle | undefined> {
    for (let attempt = 1; ; attempt++) {
      const opened = await this.openOnce(ref, path);
      if (opened !== REPLACED) return opened;
      if (attempt >= REPLACED_OPEN_ATTEMPTS) {
        throw this.refused(ref, 'its path changed while it was opened');
      }
    }
  }

  private async openOnce(
    ref: string,
    path: string,
  ): Promise<FileHandle | undefined | typeof REPLACED> {
    if (!(await this.directoryExists(ref, dirname(path)))) return undefined;
    let handle: FileHandle;
    try {
      handle = await open(path, constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0));
    } catch (error) {
      if (isMissing(error)) return undefined;
      if (hasCode(error, 'ELOOP')) throw this.refused(ref, 'it names a symbolic link');
      throw error;
    }
    let keep = false;
    try {
      const opened = await handle.stat();
      if (!opened.isFile()) throw this.refused(ref, 'it does not name a regular file');
      if ((await realpath(path)) !== path) {
        throw this.refused(ref, 'its path changed while it was opened');
      }
      const current = await lstat(path);
      if (!sameFile(opened, current)) {
        if (current.isFile()) return REPLACED;
        throw this.refused(ref, 'its path changed while it was opened');
      }
      keep = true;
      return handle;
    } catch (error) {
      if (isMissing(error)) return undefined;
      throw error;
    } finally {
      if (!keep) await handle.close();
    }
  }

  refused(ref: string, why: string): InvalidPayloadRefError {
    return new InvalidPayloadRefError(FILESYSTEM_STORE_NAME, ref, why);
  }
}

/** Whether two stats are of one file (device and inode; so also of one type). */
export function sameFile(a: Stats, b: Stats): boolean {
  return a.dev === b.dev && a.ino === b.ino;
}

/** By shape, not `instanceof Error`: errors from Node's internals may come from another realm. */
export function hasCode(error: unknown, code: string): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: unknown }).code === code;
}

export const isMissing = (error: unknown): boolean =>
  hasCode(error, 'ENOENT') || hasCode(error, 'ENOTDIR');

/** fsyncs a directory: the entries created, renamed or removed in it last. */
export async function syncDirectory(directory: string): Promise<void> {
  const handle = await open(directory, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}
