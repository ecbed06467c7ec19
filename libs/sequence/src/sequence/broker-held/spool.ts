import { createCipheriv, randomBytes, randomUUID } from 'node:crypto';
import { lstat, mkdir, open, readdir, rm, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { crc32Continued } from '../../core/checksum';
import { StoredFragmentIntegrityError } from '../../core/errors/stored-fragment-integrity.error';

/** Largest piece a spool read hands over at once. */
const READ_PIECE_BYTES = 1024 * 1024;
/** Hex digits after the PID in the name of a process's directory. */
const SUFFIX_LENGTH = 8;
/** The spool's directories and files: its bodies are for this process's user alone. */
const DIRECTORY_MODE = 0o700;
const FILE_MODE = 0o600;
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
  /** With `encrypt`: this spool's key, in this process's memory only. */
  private readonly key?: Buffer;
  private readonly sharedRoot: boolean;
  private reserved = 0;
  private opened?: Promise<void>;
  /** Files being made now (`create`), which `close` waits for. */
  private readonly creating = new Set<Promise<SpoolFile>>();
  private closed = false;

  /**
   * `encrypt`: every body is written encrypted (AES-256-CTR, a key made for this spool and kept
   * in memory, an IV per file): what a crash leaves on disk is unreadable. The layout does not
   * change (CTR keeps lengths and reads at any offset); each body's CRC-32 is still checked on
   * the plaintext as it is read back. Either way the spool's directories are made `0700` and its
   * files `0600`. `sharedRoot`: `root` lies in a directory other users write to (the default, in
   * the temporary directory): one another user made first is refused, and the spool not used.
   */
  constructor(
    private readonly root: string,
    private readonly maxBytes: number,
    { encrypt = false, sharedRoot = false }: { encrypt?: boolean; sharedRoot?: boolean } = {},
  ) {
    this.sharedRoot = sharedRoot;
    this.dir = join(root, `${process.pid}-${randomUUID().slice(0, SUFFIX_LENGTH)}`);
    if (encrypt) this.key = randomBytes(KEY_BYTES);
    openHere.add(this.dir);
  }

  /** Whether bodies are written encrypted. */
  get encrypts(): boolean {
    return this.key !== undefined;
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
    const cipher = this.key && new SpoolCipher(this.key, randomBytes(IV_BYTES));
    return new SpoolFile(path, await this.openFile(path), cipher);
  }

  private async openFile(path: string): Promise<FileHandle> {
    // `wx+`: a fresh name; whatever is found at it (a link planted there) is never followed.
    try {
      return await open(path, 'wx+', FILE_MODE);
    } catch (error) {
      // The directory was removed under the running process (a temp-directory cleaner, an
      // operator): made again, else every later sequence would go through the store.
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT' || this.closed) throw error;
      // The root may have gone too, and been made again by whoever came first.
      await this.makeDirectory();
      return open(path, 'wx+', FILE_MODE);
    }
  }

  private async prepare(): Promise<void> {
    await this.makeDirectory();
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

  /** This process's directory, under a root of its user's when the root is shared. */
  private async makeDirectory(): Promise<void> {
    await mkdir(this.root, { recursive: true, mode: DIRECTORY_MODE });
    if (this.sharedRoot) await this.assertOwnRoot();
    await mkdir(this.dir, { recursive: true, mode: DIRECTORY_MODE });
  }

  /**
   * In a shared temporary directory, another user could have made the root first, or put a link
   * there: the root must be a directory (not a link) of this process's user.
   */
  private async assertOwnRoot(): Promise<void> {
    const self = process.getuid?.();
    if (self === undefined) return;
    const found = await lstat(this.root);
    if (!found.isDirectory()) {
      throw new Error(
        `the spool's default directory ${this.root} is not a directory (a link?); remove it or ` +
          'set sequence.spool.dir',
      );
    }
    if (found.uid !== self) {
      throw new Error(
        `the spool's default directory ${this.root} belongs to user ${found.uid}, not to this ` +
          `process (user ${self}); remove it or set sequence.spool.dir`,
      );
    }
  }
}

/** One sequence's bodies, written where the caller says and read back in the order it asks. */
export class SpoolFile {
  private closed?: Promise<void>;

  constructor(
    readonly path: string,
    private readonly handle: FileHandle,
    private readonly cipher?: SpoolCipher,
  ) {}

  /** Writes `body` at `offset`; resolves once the file holds it (in the page cache). */
  async write(plain: Buffer, offset: number): Promise<void> {
    const body = this.cipher ? this.cipher.at(offset, plain) : plain;
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
    const { handle, cipher } = this;
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
            const stored = bytesRead === piece.length ? piece : piece.subarray(0, bytesRead);
            const read = cipher ? cipher.at(offset + done, stored) : stored;
            done += bytesRead;
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

const KEY_BYTES = 32;
const IV_BYTES = 16;
const BLOCK_BYTES = 16;

/**
 * AES-256-CTR over one spool file: the bytes at any offset are encrypted (or decrypted: the same
 * operation) with the key stream from that offset on, so that bodies written and read in any
 * order at their own offsets need no framing.
 */
class SpoolCipher {
  constructor(
    private readonly key: Buffer,
    private readonly iv: Buffer,
  ) {}

  /** `bytes` as they are at `offset` of the file, encrypted or decrypted: a new Buffer. */
  at(offset: number, bytes: Buffer): Buffer {
    const skip = offset % BLOCK_BYTES;
    const cipher = createCipheriv('aes-256-ctr', this.key, this.counterAt(offset - skip));
    if (skip > 0) cipher.update(Buffer.alloc(skip));
    return cipher.update(bytes);
  }

  /** The 128-bit counter block of the block that starts at `offset`: the IV plus its index. */
  private counterAt(offset: number): Buffer {
    const block =
      (BigInt(`0x${this.iv.toString('hex')}`) + BigInt(offset / BLOCK_BYTES)) % 2n ** 128n;
    return Buffer.from(block.toString(16).padStart(IV_BYTES * 2, '0'), 'hex');
  }
}
