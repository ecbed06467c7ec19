import { randomUUID } from 'node:crypto';
import { mkdir, open, readdir, rm, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { crc32Continued } from '../../core/checksum';
import { StoredFragmentIntegrityError } from '../../core/errors/stored-fragment-integrity.error';

/** Largest piece a spool read hands over at once. */
const READ_PIECE_BYTES = 1024 * 1024;
/** Hex digits after the PID in the name of a process's directory. */
const SUFFIX_LENGTH = 8;
/** A process's directory: `<pid>-<8 hex digits>`; nothing else under the root is the spool's. */
const PROCESS_DIR = new RegExp(`^([1-9][0-9]*)-[0-9a-f]{${SUFFIX_LENGTH}}$`);

/** Where one body lies in a spool file. */
export interface SpoolRange {
  readonly offset: number;
  readonly length: number;
}

/** A body's place in a spool file, with its position and CRC-32 (its `x-fragment-crc32`). */
export interface CheckedRange extends SpoolRange {
  readonly position: number;
  readonly crc32: number;
}

/**
 * This process's spool: a directory of its own under the configured one, holding one file per
 * broker-held sequence, within a byte budget. Directories of processes that are gone (crashed) are
 * removed when a spool opens, so a crash leaves nothing behind for long.
 */
/** The spool directories open in this process (several modules or apps may each have one). */
const openHere = new Set<string>();

export class Spool {
  private readonly dir: string;
  private reserved = 0;
  private opened?: Promise<void>;
  /** Files being made now (`create`), which `close` waits for. */
  private readonly creating = new Set<Promise<SpoolFile>>();
  private closed = false;

  constructor(
    private readonly root: string,
    private readonly maxBytes: number,
  ) {
    this.dir = join(root, `${process.pid}-${randomUUID().slice(0, SUFFIX_LENGTH)}`);
    openHere.add(this.dir);
  }

  /** Bytes reserved by the files open now. */
  get bytes(): number {
    return this.reserved;
  }

  /** Reserves room for `bytes` more; false when that would pass `maxBytes`. */
  reserve(bytes: number): boolean {
    if (this.reserved + bytes > this.maxBytes) return false;
    this.reserved += bytes;
    return true;
  }

  release(bytes: number): void {
    this.reserved = Math.max(0, this.reserved - bytes);
  }

  /** A new, empty file for one sequence. */
  async create(): Promise<SpoolFile> {
    if (this.closed) throw new Error('the spool is closed');
    const creating = this.createFile();
    this.creating.add(creating);
    try {
      return await creating;
    } finally {
      this.creating.delete(creating);
    }
  }

  /**
   * Removes this process's directory and everything in it, once the files being made are: each
   * may make the directory (again), which would otherwise outlive the spool.
   */
  async close(): Promise<void> {
    this.closed = true;
    openHere.delete(this.dir);
    await Promise.allSettled([...this.creating]);
    await rm(this.dir, { recursive: true, force: true });
  }

  private async createFile(): Promise<SpoolFile> {
    // A failed preparation (a full disk, say) is tried again by the next sequence.
    this.opened ??= this.prepare().catch((error: unknown) => {
      this.opened = undefined;
      throw error;
    });
    await this.opened;
    const path = join(this.dir, `${randomUUID()}.spool`);
    return new SpoolFile(path, await this.openFile(path));
  }

  private async openFile(path: string): Promise<FileHandle> {
    try {
      return await open(path, 'w+');
    } catch (error) {
      // The directory was removed under the running process (a temp-directory cleaner, an
      // operator): made again, else every later sequence would go through the store.
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT' || this.closed) throw error;
      await mkdir(this.dir, { recursive: true });
      return open(path, 'w+');
    }
  }

  private async prepare(): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    const entries = await readdir(this.root, { withFileTypes: true }).catch(() => []);
    for (const entry of entries) {
      // Only a process's spool directory: the root may hold other data (a shared volume, /tmp).
      const named = entry.isDirectory() ? PROCESS_DIR.exec(entry.name) : null;
      const pid = Number(named?.[1]);
      const path = join(this.root, entry.name);
      if (!named || !Number.isSafeInteger(pid) || openHere.has(path)) continue;
      // This process's PID on a directory no spool of it has open: an earlier process that had
      // the same PID (a container's node restarted as PID 1 again, a recycled PID), gone.
      if (pid === process.pid || !isAlive(pid)) {
        await rm(path, { recursive: true, force: true }).catch(() => undefined);
      }
    }
  }
}

/** One sequence's bodies, written where the caller says and read back in the order it asks. */
export class SpoolFile {
  private closed?: Promise<void>;

  constructor(
    readonly path: string,
    private readonly handle: FileHandle,
  ) {}

  /** Writes `body` at `offset`; resolves once the file holds it (in the page cache). */
  async write(body: Buffer, offset: number): Promise<void> {
    let written = 0;
    while (written < body.length) {
      const { bytesWritten } = await this.handle.write(
        body,
        written,
        body.length - written,
        offset + written,
      );
      written += bytesWritten;
    }
  }

  /**
   * The bytes of `ranges`, one after the other, a piece of at most 1 MiB at a time. Each body is
   * checked against its CRC-32 as it is read: bytes changed on disk since they were written fail
   * the stream with a {@link StoredFragmentIntegrityError} before the body's last piece is passed
   * on (so before any of a body of 1 MiB or less).
   */
  read(ranges: readonly CheckedRange[], sequenceId: string): Readable {
    const handle = this.handle;
    return Readable.from(
      (async function* () {
        for (const { offset, length, position, crc32 } of ranges) {
          let done = 0;
          let crc = 0;
          while (done < length) {
            const piece = Buffer.allocUnsafe(Math.min(READ_PIECE_BYTES, length - done));
            const { bytesRead } = await handle.read(piece, 0, piece.length, offset + done);
            if (bytesRead === 0) {
              throw new Error(`the spool file ${handle.fd} ended ${length - done} bytes short`);
            }
            done += bytesRead;
            const read = bytesRead === piece.length ? piece : piece.subarray(0, bytesRead);
            crc = crc32Continued(read, crc);
            if (done === length && crc !== crc32) {
              throw new StoredFragmentIntegrityError(sequenceId, position, crc32, crc, 'spool');
            }
            yield read;
          }
        }
      })(),
      { objectMode: false },
    );
  }

  /** Closes and deletes the file; idempotent. */
  remove(): Promise<void> {
    this.closed ??= this.handle
      .close()
      .catch(() => undefined)
      .then(() => rm(this.path, { force: true }));
    return this.closed;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}
