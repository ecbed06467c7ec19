import { randomUUID } from 'node:crypto';
import { constants } from 'node:fs';
import {
  access,
  lstat,
  mkdir,
  open,
  realpath,
  rename,
  lutimes,
  stat,
  writeFile,
} from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { ClaimCheckNotFoundError } from '../../../core/errors';
import type {
  PayloadInfo,
  PayloadStore,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
} from '../../../ports/payload-store.port';
import {
  daySegments,
  DIRECTORY_MODE,
  FILE_MODE,
  FILESYSTEM_STORE_NAME,
  FilesystemPayloadLayout,
  isMissing,
  LATEST_EXPIRY,
  sameFile,
  temporaryName,
} from './filesystem.payload-layout';
import {
  DEFAULT_FILESYSTEM_PAYLOAD_ROOT,
  type FilesystemPayloadStoreOptions,
  resolveFilesystemPayloadStoreOptions,
} from './filesystem.payload-store.options';
import {
  encodeSidecar,
  readSidecar,
  type Sidecar,
  unlinkIfPresent,
  writeFileAtomically,
} from './filesystem.payload-sidecar';
import * as layoutFiles from './filesystem.payload-layout';
import { findSweepCandidates } from './filesystem.payload-sweep';
import { checkPutOptions } from '../put-options';
import { putFromSource } from '../put-source';
import { byteChunks } from '../../../core/payload-source';

/**
 * The embedded default payload store: files under a root directory.
 *
 * A payload is three files in `<root>/<yyyy>/<mm>/<dd>/` (its expiry day, UTC): `<uuid>` with the
 * bytes, `<uuid>.json` with its metadata, and `<uuid>.unpublished` while no ticket was published
 * (renamed `<uuid>.deleting` while a sweep deletes the payload as an orphan).
 * The bytes are streamed to a temporary file and renamed into place last, after the metadata, so a
 * payload is readable only once complete. Refs are `<yyyy>/<mm>/<dd>/<uuid>`; anything else is
 * refused before it reaches the filesystem, and no file is read through a symbolic link.
 *
 * @example
 * new FilesystemPayloadStore({ root: '/var/lib/my-app/payloads', fsync: true })
 */
export class FilesystemPayloadStore implements PayloadStore {
  readonly name = FILESYSTEM_STORE_NAME;
  private readonly root: string;
  private readonly fsync: boolean;
  private readonly staleTemporaryMs: number;
  private layout?: Promise<FilesystemPayloadLayout>;

  constructor(options: FilesystemPayloadStoreOptions = {}) {
    const resolved = resolveFilesystemPayloadStoreOptions(options);
    this.root = resolve(resolved.root);
    this.fsync = resolved.fsync;
    this.staleTemporaryMs = resolved.staleTemporaryMs;
  }

  put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    return putFromSource(payload, () => this.putOnce(payload, options));
  }

  private async putOnce(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    checkPutOptions(this.name, options);
    assertPutOptions(options);
    const layout = await this.ready();
    const id = randomUUID();
    const ref = [...daySegments(options.expiresAt), id].join('/');
    const files = layout.filesFor(ref);
    await layout.makeDirectory(ref, files.directory);
    const temporary = join(files.directory, temporaryName(id, randomUUID()));
    try {
      const bytes = await this.writeBytes(payload, temporary);
      const sidecar: Sidecar = {
        version: 1,
        bytes,
        createdAt: options.now,
        expiresAt: options.expiresAt,
        published: options.published,
        contentType: options.contentType,
        metadata: options.metadata,
      };
      if (!options.published) await writeFile(files.marker, '', { flag: 'wx', mode: FILE_MODE });
      await writeFileAtomically(files.sidecar, encodeSidecar(sidecar), this.fsync);
      await rename(temporary, files.data);
      if (this.fsync) {
        // The new files' entries, and those of a new day, month or year directory: each lives in
        // its parent directory.
        for (const directory of [...parentsBelow(layout.root, files.directory), files.directory]) {
          await layoutFiles.syncDirectory(directory);
        }
      }
      return { ref, bytes };
    } catch (error) {
      // The id is fresh, so every one of these files is this call's own.
      await Promise.allSettled(
        [temporary, files.data, files.sidecar, files.marker].map(unlinkIfPresent),
      );
      throw error;
    }
  }

  async get(ref: string): Promise<Readable> {
    const layout = await this.ready();
    const handle = await layout.openFile(ref, layout.filesFor(ref).data);
    if (!handle) throw new ClaimCheckNotFoundError(this.name, ref);
    return handle.createReadStream();
  }

  async head(ref: string): Promise<PayloadInfo | undefined> {
    const layout = await this.ready();
    const files = layout.filesFor(ref);
    const sidecar = await this.readSidecar(layout, ref, files.sidecar);
    if (!sidecar || !(await isRegularFile(files.data))) return undefined;
    return {
      ref,
      bytes: sidecar.bytes,
      createdAt: sidecar.createdAt,
      expiresAt: sidecar.expiresAt,
      published: sidecar.published,
      contentType: sidecar.contentType,
      metadata: sidecar.metadata,
    };
  }

  async delete(ref: string): Promise<boolean> {
    const layout = await this.ready();
    const files = layout.filesFor(ref);
    if (!(await layout.directoryExists(ref, files.directory))) return false;
    // The bytes first: once they are gone the payload is, whatever happens to the rest.
    const removed = await unlinkIfPresent(files.data);
    await unlinkIfPresent(files.marker);
    await unlinkIfPresent(files.sidecar);
    await unlinkIfPresent(files.deleting);
    return removed;
  }

  /**
   * Takes the payload by renaming its unpublished marker to its claim (`<uuid>.deleting`; atomic:
   * of a racing `markPublished`, which removes the marker first, and of another sweep, one wins),
   * then re-reads its sidecar (a payload marked before this protocol may keep a stale marker), and
   * deletes the bytes before the claim, which a losing `markPublished` looks for.
   *
   * The claim is never renamed back to the marker, not even on an error: a sweep may be finishing
   * this delete (it does once the claim is `staleTemporaryMs` old), and a marker given back would
   * let `markPublished` answer `true` before that sweep deletes the bytes. On an error the claim
   * stays and the error is thrown; a later sweep finishes the delete (see
   * `finishInterruptedDeletes`).
   */
  async deleteUnpublished(ref: string): Promise<boolean> {
    const layout = await this.ready();
    const files = layout.filesFor(ref);
    if (!(await layout.directoryExists(ref, files.directory))) return false;
    try {
      await rename(files.marker, files.deleting);
    } catch (error) {
      if (isMissing(error)) return false; // published, gone, or taken by another sweep
      throw error;
    }
    // A claim's age is its last change: a sweep finishes one whose claimant died.
    const now = new Date();
    try {
      await lutimes(files.deleting, now, now);
    } catch (error) {
      if (isMissing(error)) return false; // a delete (expiry, release()) took it meanwhile
      throw error;
    }
    const sidecar = await this.readSidecar(layout, ref, files.sidecar);
    if (sidecar?.published) {
      await unlinkIfPresent(files.deleting);
      return false;
    }
    const removed = await unlinkIfPresent(files.data);
    await unlinkIfPresent(files.sidecar);
    await unlinkIfPresent(files.deleting);
    return removed;
  }

  /**
   * Removes the unpublished marker first: from then on no sweep can take the payload as an
   * orphan. Finding it already renamed to a sweep's claim, it answers `false` unless the sidecar
   * says published (that sweep then keeps the payload); the sweep, reading an unpublished
   * sidecar, deletes it. Then the sidecar is rewritten as published.
   *
   * Why `true` means the payload stays: the marker is created once, by `put`, and never comes
   * back once removed or renamed (no claim is given back). Removing it, this call wins: no claim
   * can follow. Finding the claim, it rewrites nothing, and the sidecar it answers from is the one
   * the claimant (or a sweep finishing its delete) decides on. Finding neither, any claim is over:
   * the bytes went before it did, so they are still there only if the claimant kept them.
   */
  async markPublished(ref: string): Promise<boolean> {
    const layout = await this.ready();
    const files = layout.filesFor(ref);
    const sidecar = await this.readSidecar(layout, ref, files.sidecar);
    if (!sidecar || !(await isRegularFile(files.data))) return false;
    if (!(await unlinkIfPresent(files.marker)) && (await isRegularFile(files.deleting))) {
      const current = await this.readSidecar(layout, ref, files.sidecar);
      return current?.published === true && (await isRegularFile(files.data));
    }
    // A crash before this rewrite leaves no marker: the payload is kept until it expires.
    if (!sidecar.published) {
      await writeFileAtomically(
        files.sidecar,
        encodeSidecar({ ...sidecar, published: true }),
        this.fsync,
      );
    }
    // The marker's removal and the sidecar's rename are entries of the directory: without this,
    // a power loss could bring back an unpublished payload that a sweep would then delete.
    if (this.fsync) await layoutFiles.syncDirectory(files.directory);
    if (await isRegularFile(files.data)) return true;
    // A delete ran meanwhile; do not leave the sidecar we rewrote behind it.
    await unlinkIfPresent(files.sidecar);
    return false;
  }

  /** See `findSweepCandidates` for what a sweep costs. */
  async sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    const layout = await this.ready();
    if (query.limit <= 0) return [];
    return findSweepCandidates(layout, query, Date.now() - this.staleTemporaryMs);
  }

  async ping(): Promise<void> {
    const layout = await this.ready();
    await access(layout.root, constants.R_OK | constants.W_OK | constants.X_OK);
  }

  async close(): Promise<void> {
    // Owns no connection; every file handle is closed by the operation (or stream) that opened it.
  }

  private ready(): Promise<FilesystemPayloadLayout> {
    this.layout ??= this.prepare().catch((error: unknown) => {
      this.layout = undefined;
      throw error;
    });
    return this.layout;
  }

  private async prepare(): Promise<FilesystemPayloadLayout> {
    await mkdir(this.root, { recursive: true, mode: DIRECTORY_MODE });
    const self = process.getuid?.();
    if (self === undefined || this.root !== DEFAULT_FILESYSTEM_PAYLOAD_ROOT) {
      return new FilesystemPayloadLayout(await realpath(this.root));
    }
    // In a shared temporary directory another user could have created the root first, or a link
    // there to a directory of this user's that they can reach. The entry is looked at before it
    // is resolved, and must be the same entry after: they could swap a link for a directory of
    // theirs (or the other way round) between the two.
    const entry = await lstat(this.root);
    if (entry.isSymbolicLink() && entry.uid !== self) {
      throw new Error(
        `the filesystem payload store's default root ${this.root} is a symbolic link of user ` +
          `${entry.uid}, not of this process (user ${self}); remove it or configure a root ` +
          'of your own',
      );
    }
    const real = await realpath(this.root);
    const after = await lstat(this.root);
    const target = await stat(real);
    // One device and inode: one file, so one type too.
    const sameEntry = sameFile(after, entry) && (!entry.isDirectory() || sameFile(target, entry));
    if (!sameEntry) {
      throw new Error(
        `the filesystem payload store's default root ${this.root} was replaced while it was ` +
          'checked; remove it or configure a root of your own',
      );
    }
    if (target.uid !== self) {
      throw new Error(
        `the filesystem payload store's default root ${real} belongs to user ${target.uid}, not ` +
          `to this process (user ${self}); remove it or configure a root of your own`,
      );
    }
    return new FilesystemPayloadLayout(real);
  }

  private async writeBytes(payload: Buffer | Readable, temporary: string): Promise<number> {
    // `wx`: a file or link already at the temporary name makes the put fail, never followed.
    // Opened here, not by the write stream: a stream opens its file in the background, so a
    // source failing at once could leave that open to create the file after put's cleanup.
    const handle = await open(temporary, 'wx', FILE_MODE);
    try {
      const sink = handle.createWriteStream({ flush: this.fsync });
      const source = Buffer.isBuffer(payload) ? Readable.from([payload]) : payload;
      await pipeline(source, byteChunks, sink);
      return sink.bytesWritten;
    } finally {
      // The stream closes the file as it ends or fails; this waits for that.
      await handle.close();
    }
  }

  private async readSidecar(
    layout: FilesystemPayloadLayout,
    ref: string,
    path: string,
  ): Promise<Sidecar | undefined> {
    const handle = await layout.openFile(ref, path);
    return handle && readSidecar(handle, path);
  }
}

function assertPutOptions(options: PutOptions): void {
  if (!Number.isFinite(options.now)) {
    throw new RangeError(`put needs a finite now (epoch ms), got ${options.now}`);
  }
  if (!Number.isFinite(options.expiresAt) || options.expiresAt < 0) {
    throw new RangeError(`put needs expiresAt as epoch ms, got ${options.expiresAt}`);
  }
  if (options.expiresAt > LATEST_EXPIRY) {
    throw new RangeError(`expiresAt ${options.expiresAt} is past the year 9999`);
  }
}

async function isRegularFile(path: string): Promise<boolean> {
  try {
    return (await lstat(path)).isFile();
  } catch (error) {
    if (isMissing(error)) return false;
    throw error;
  }
}

/**
 * The directories whose entries a put into `directory` may have changed: the root and every
 * directory below it, down to `directory`'s parent. Not only those this put's `mkdir` created: a
 * concurrent put may have created them, and not yet synced them, when this one resolves.
 */
function parentsBelow(root: string, directory: string): string[] {
  const parents: string[] = [];
  for (let current = directory; current !== root && dirname(current) !== current;) {
    current = dirname(current);
    parents.unshift(current);
  }
  return parents;
}
