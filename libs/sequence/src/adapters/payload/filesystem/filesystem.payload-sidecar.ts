import { randomUUID } from 'node:crypto';
import { type FileHandle, open, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import type { PayloadMetadata } from '../../../ports/payload-store.port';
import { isStringRecord } from '../../../core/objects';
import { decodeStoredJson } from '../stored-metadata';
import {
  FILE_MODE,
  FILESYSTEM_STORE_NAME,
  isMissing,
  temporaryName,
} from './filesystem.payload-layout';

/** What `<id>.json` holds beside a payload's bytes. */
export interface Sidecar extends PayloadMetadata {
  readonly version: 1;
  readonly bytes: number;
  readonly createdAt: number;
}

export function encodeSidecar(sidecar: Sidecar): string {
  return JSON.stringify(sidecar);
}

/** Parses a sidecar, refusing anything this store would not have written. */
export function decodeSidecar(text: string, path: string): Sidecar {
  return decodeStoredJson(
    FILESYSTEM_STORE_NAME,
    path,
    text,
    isSidecar,
    'a payload sidecar of version 1',
  );
}

function isSidecar(value: unknown): value is Sidecar {
  if (typeof value !== 'object' || value === null) return false;
  const record = value as Record<string, unknown>;
  return (
    record.version === 1 &&
    Number.isSafeInteger(record.bytes) &&
    Number.isFinite(record.createdAt) &&
    Number.isFinite(record.expiresAt) &&
    typeof record.published === 'boolean' &&
    (record.contentType === undefined || typeof record.contentType === 'string') &&
    // An object of strings, as the other stores require (a list is not one).
    (record.metadata === undefined || isStringRecord(record.metadata))
  );
}

export async function readSidecar(handle: FileHandle, path: string): Promise<Sidecar> {
  try {
    return decodeSidecar(await handle.readFile('utf8'), path);
  } finally {
    await handle.close();
  }
}

/**
 * Writes `content` to `path` so that readers see the old file or the new one, never half of one:
 * a temporary file in the same directory (created exclusively, so a planted file or link there
 * makes it fail rather than be followed), then a rename.
 */
export async function writeFileAtomically(
  path: string,
  content: string,
  fsync: boolean,
): Promise<void> {
  const temporary = join(dirname(path), temporaryName(basename(path), randomUUID()));
  try {
    const handle = await open(temporary, 'wx', FILE_MODE);
    try {
      await handle.writeFile(content, 'utf8');
      if (fsync) await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temporary, path);
  } catch (error) {
    await unlinkIfPresent(temporary);
    throw error;
  }
}

/** `unlink` that answers whether it removed something. */
export async function unlinkIfPresent(path: string): Promise<boolean> {
  try {
    await unlink(path);
    return true;
  } catch (error) {
    if (isMissing(error)) return false;
    throw error;
  }
}
