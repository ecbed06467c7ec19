import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, sep } from 'node:path';
import { Logger } from '@nestjs/common';

/**
 * The libraries whose internals the adapters' socket tricks (`unsafeSocketTricks`) reach into,
 * and the versions each trick was written and tested for. On any other version a trick stays
 * off: an internal may have moved, and a trick that misread it could corrupt a connection.
 */
const WRITTEN_FOR = {
  amqplib: { range: '0.10.x', accepts: /^0\.10\.\d+(?:[-+].*)?$/ },
  ioredis: { range: '5.x', accepts: /^5\.\d+\.\d+(?:[-+].*)?$/ },
  '@nats-io/nats-core': { range: '3.x', accepts: /^3\.\d+\.\d+(?:[-+].*)?$/ },
} as const;

export type TrickedLibrary = keyof typeof WRITTEN_FOR;

/**
 * The version in `library`'s package.json, as this library resolves it (the copy an application
 * normally shares with it), or undefined when it cannot be read. A package whose `exports` do not
 * list its package.json (`@nats-io/nats-core`) has it read from beside its entry point.
 */
export function installedVersion(library: TrickedLibrary): string | undefined {
  const require = createRequire(__filename);
  try {
    return versionIn(require(`${library}/package.json`));
  } catch {
    try {
      const entry = require.resolve(library);
      const root = `${join('node_modules', library)}${sep}`;
      const at = entry.lastIndexOf(root);
      if (at === -1) return undefined;
      const manifest = readFileSync(join(entry.slice(0, at + root.length), 'package.json'), 'utf8');
      return versionIn(JSON.parse(manifest));
    } catch {
      return undefined;
    }
  }
}

function versionIn(manifest: unknown): string | undefined {
  const version = (manifest as { version?: unknown } | null)?.version;
  return typeof version === 'string' ? version : undefined;
}

/**
 * Whether `owner`'s socket tricks on `library` may run: only when asked for
 * (`unsafeSocketTricks: true`), and only on a version of `library` they were written for (read
 * from its package.json). Asked for on another version, or one that cannot be read, it logs one
 * warning and answers false: the adapter then uses the library's public API only, as without the
 * option. Never throws.
 */
export function socketTricksEnabled(
  requested: boolean,
  library: TrickedLibrary,
  owner: string,
): boolean {
  return requested && acceptsVersion(library, installedVersion(library), owner);
}

/**
 * Whether `version` of `library` is one the socket tricks were written for; when it is not
 * (undefined: unknown), logs one warning naming `owner` and what to do.
 */
export function acceptsVersion(
  library: TrickedLibrary,
  version: string | undefined,
  owner: string,
): boolean {
  const { range, accepts } = WRITTEN_FOR[library];
  if (version !== undefined && accepts.test(version)) return true;
  const installed =
    version === undefined
      ? `the installed version of ${library} could not be read`
      : `${library} ${version} is installed`;
  new Logger(owner).warn(
    `unsafeSocketTricks is on, but its socket tricks were written for ${library} ${range} and ` +
      `${installed}: they stay off, and ${owner} uses ${library}'s public API only. Remove ` +
      `unsafeSocketTricks, or use ${library} ${range}.`,
  );
  return false;
}

/** The problem with an `unsafeSocketTricks` option that is not a boolean, for option checks. */
export function unsafeSocketTricksProblem(value: unknown): string | undefined {
  return value === undefined || typeof value === 'boolean'
    ? undefined
    : `unsafeSocketTricks must be true or false, got ${JSON.stringify(value) ?? typeof value}`;
}
