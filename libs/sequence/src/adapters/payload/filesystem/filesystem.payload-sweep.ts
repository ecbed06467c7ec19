import { lstat, readdir, rmdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { SweepCandidate, SweepQuery } from '../../../ports/payload-store.port';
import {
  DAY_MS,
  DAY_PATTERN,
  deletingName,
  type FilesystemPayloadLayout,
  ID_PATTERN,
  isMissing,
  isTemporaryName,
  markerName,
  MONTH_PATTERN,
  sidecarName,
  startOfDay,
  YEAR_PATTERN,
} from './filesystem.payload-layout';
import { readSidecar, type Sidecar, unlinkIfPresent } from './filesystem.payload-sidecar';

interface DayDirectory {
  readonly directory: string;
  /** `<yyyy>/<mm>/<dd>`, the start of every ref in it. */
  readonly prefix: string;
  /** Start of the UTC day (epoch ms): every payload in it expires in [start, start + 1 day). */
  readonly start: number;
}

/**
 * Walks the day directories oldest first and collects up to `query.limit` candidates.
 *
 * Cost: one `readdir` per year, month and day directory walked (the walk stops once the limit is
 * reached). Payloads are filed under their expiry day, so a day that ended before `query.now` is
 * listed as expired from its directory entries alone; a sidecar is read only for payloads
 * expiring on the day of `query.now` and for unpublished ones (found by their marker file). A
 * store with millions of published, unexpired payloads therefore costs a directory listing per
 * day, not a file read per payload.
 *
 * On the way it removes leftovers of crashed processes older than `staleBefore` (epoch ms, file
 * mtime): temporary files, and sidecars or markers whose payload never got renamed into place.
 * And it finishes the orphan deletes that a crash interrupted (see `finishInterruptedDeletes`).
 */
export async function findSweepCandidates(
  layout: FilesystemPayloadLayout,
  query: SweepQuery,
  staleBefore: number,
): Promise<SweepCandidate[]> {
  const candidates: SweepCandidate[] = [];
  for await (const day of dayDirectories(layout.root)) {
    if (candidates.length >= query.limit) break;
    await sweepDay(layout, day, query, staleBefore, candidates);
  }
  return candidates;
}

async function* dayDirectories(root: string): AsyncGenerator<DayDirectory> {
  for (const year of await subdirectories(root, YEAR_PATTERN)) {
    for (const month of await subdirectories(join(root, year), MONTH_PATTERN)) {
      for (const day of await subdirectories(join(root, year, month), DAY_PATTERN)) {
        yield {
          directory: join(root, year, month, day),
          prefix: `${year}/${month}/${day}`,
          start: startOfDay(Number(year), Number(month), Number(day)),
        };
      }
    }
  }
}

/** Names of real subdirectories (links are not directories here) that match, sorted. */
async function subdirectories(directory: string, pattern: RegExp): Promise<string[]> {
  const entries = await readdirOrEmpty(directory);
  return entries
    .filter((entry) => entry.isDirectory() && pattern.test(entry.name))
    .map((entry) => entry.name)
    .sort();
}

async function readdirOrEmpty(directory: string) {
  try {
    return await readdir(directory, { withFileTypes: true });
  } catch (error) {
    if (isMissing(error)) return [];
    throw error;
  }
}

async function sweepDay(
  layout: FilesystemPayloadLayout,
  day: DayDirectory,
  query: SweepQuery,
  staleBefore: number,
  candidates: SweepCandidate[],
): Promise<void> {
  const names = new Set<string>(
    (await readdirOrEmpty(day.directory))
      .filter((entry) => entry.isFile())
      .map((entry) => entry.name),
  );
  await removeStaleLeftovers(day.directory, names, staleBefore);
  await finishInterruptedDeletes(layout, day, names, staleBefore);

  const wholeDayExpired = day.start + DAY_MS - 1 <= query.now;
  if (wholeDayExpired && names.size === 0) {
    // Its payloads all gone: without this, every sweep would list every day ever used.
    await removeEmptyDirectories(day.directory, 3);
    return;
  }
  const dayMayHaveExpired = day.start <= query.now;
  for (const id of [...names].filter((name) => ID_PATTERN.test(name)).sort()) {
    if (candidates.length >= query.limit) return;
    const ref = `${day.prefix}/${id}`;
    if (wholeDayExpired) {
      candidates.push({ ref, reason: 'expired' });
      continue;
    }
    const hasMarker = names.has(markerName(id));
    if (!dayMayHaveExpired && !hasMarker) continue;

    const sidecar = await sidecarOf(layout, ref, join(day.directory, sidecarName(id)));
    if (!sidecar) continue;
    if (sidecar.expiresAt <= query.now) {
      candidates.push({ ref, reason: 'expired' });
    } else if (!sidecar.published && sidecar.createdAt <= query.unpublishedBefore) {
      candidates.push({ ref, reason: 'orphaned' });
    } else if (sidecar.published && hasMarker) {
      // markPublished crashed between its two steps: the sidecar is the truth.
      await unlinkIfPresent(join(day.directory, markerName(id)));
    }
  }
}

/** The sidecar, or `undefined` when it vanished (a concurrent delete) or cannot be parsed. */
async function sidecarOf(
  layout: FilesystemPayloadLayout,
  ref: string,
  path: string,
): Promise<Sidecar | undefined> {
  try {
    const handle = await layout.openFile(ref, path);
    return handle && (await readSidecar(handle, path));
  } catch {
    // A corrupt or replaced sidecar must not stop the sweep of everything after it.
    return undefined;
  }
}

async function removeStaleLeftovers(
  directory: string,
  names: ReadonlySet<string>,
  staleBefore: number,
): Promise<void> {
  for (const name of names) {
    const owner = name.replace(/\.(json|unpublished|deleting)$/, '');
    const orphanedPart = owner !== name && ID_PATTERN.test(owner) && !names.has(owner);
    if (!isTemporaryName(name) && !orphanedPart) continue;
    const path = join(directory, name);
    try {
      if ((await lstat(path)).mtimeMs < staleBefore) await unlinkIfPresent(path);
    } catch (error) {
      if (!isMissing(error)) throw error;
    }
  }
}

/**
 * A `<uuid>.deleting` claim beside its bytes, unchanged since `staleBefore`, is a
 * `deleteUnpublished` that died (or stalled) after taking the payload: without this its payload
 * would never be swept, and every `markPublished` would answer `false`. The sweep finishes that
 * delete as the claimant would have: it re-reads the sidecar and, unless it says published,
 * removes the bytes, the sidecar, then the claim; published, it removes only the claim. A sidecar
 * it cannot read leaves all three for the payload's expiry.
 *
 * The claim is never turned back into the marker: a claimant still running may have read the
 * sidecar as unpublished and be about to delete the bytes, and a marker would let `markPublished`
 * answer `true` first. Finishing is safe however many sweeps and claimants do it at once: while a
 * claim exists no `markPublished` publishes the payload (it answers from the sidecar without
 * rewriting it), a claim is removed only after the bytes are or when the sidecar says published,
 * and every step is an idempotent unlink.
 */
async function finishInterruptedDeletes(
  layout: FilesystemPayloadLayout,
  day: DayDirectory,
  names: Set<string>,
  staleBefore: number,
): Promise<void> {
  for (const id of [...names].filter((name) => ID_PATTERN.test(name))) {
    if (!names.has(deletingName(id))) continue;
    try {
      await finishInterruptedDelete(layout, day, names, id, staleBefore);
    } catch {
      // One payload whose files cannot be removed (EACCES, EBUSY) must not stop the sweep of
      // everything after it, in this store and run; the next sweep tries it again.
    }
  }
}

async function finishInterruptedDelete(
  layout: FilesystemPayloadLayout,
  day: DayDirectory,
  names: Set<string>,
  id: string,
  staleBefore: number,
): Promise<void> {
  const claim = join(day.directory, deletingName(id));
  try {
    // A rename sets the claim's ctime on Linux; a claimant also sets its mtime to now.
    const { mtimeMs, ctimeMs } = await lstat(claim);
    if (Math.max(mtimeMs, ctimeMs) >= staleBefore) return;
  } catch (error) {
    if (isMissing(error)) return; // its claimant finished meanwhile
    throw error;
  }
  const sidecarPath = join(day.directory, sidecarName(id));
  let sidecar: Sidecar | undefined;
  try {
    const handle = await layout.openFile(`${day.prefix}/${id}`, sidecarPath);
    sidecar = handle && (await readSidecar(handle, sidecarPath));
  } catch {
    return; // unreadable: neither published nor not; the payload's expiry deletes it
  }
  if (!sidecar?.published) {
    // A sidecar gone counts as unpublished: a finisher removed it, after the bytes.
    await unlinkIfPresent(join(day.directory, id));
    await unlinkIfPresent(sidecarPath);
    names.delete(id);
    names.delete(sidecarName(id));
  }
  await unlinkIfPresent(claim);
  names.delete(deletingName(id));
}

/**
 * Removes `directory` if it is empty, then its parents up to `levels` in all while they are empty
 * (a day, then its month, then its year). A directory a concurrent write filled meanwhile stays.
 */
async function removeEmptyDirectories(directory: string, levels: number): Promise<void> {
  let current = directory;
  for (let level = 0; level < levels; level++) {
    try {
      await rmdir(current);
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (code === 'ENOTEMPTY' || code === 'EEXIST' || isMissing(error)) return;
      throw error;
    }
    current = dirname(current);
  }
}
