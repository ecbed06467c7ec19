import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Logger } from '@nestjs/common';

/**
 * The libraries whose internals the adapters' socket tricks (`unsafeSocketTricks`) reach into,
 * and the versions each trick was written and tested for. On any other version a trick stays
 * off: an internal may have moved, and a trick that misread it could corrupt a connection.
 * `via`: the package whose copy of the library makes the connections (the NATS client's core is
 * a dependency of `@nats-io/transport-node`, not of this library or of the application).
 */
const WRITTEN_FOR: Record<
  'amqplib' | 'ioredis' | '@nats-io/nats-core',
  { readonly range: string; readonly accepts: RegExp; readonly via?: string }
> = {
  amqplib: { range: '0.10.x', accepts: /^0\.10\.\d+(?:[-+].*)?$/ },
  ioredis: { range: '5.x', accepts: /^5\.\d+\.\d+(?:[-+].*)?$/ },
  '@nats-io/nats-core': {
    range: '3.x',
    accepts: /^3\.\d+\.\d+(?:[-+].*)?$/,
    via: '@nats-io/transport-node',
  },
};

export type TrickedLibrary = keyof typeof WRITTEN_FOR;

/**
 * The version in `library`'s package.json, as the package that uses it resolves it (this library,
 * or `via`), or undefined when it cannot be read. A package whose `exports` do not list its
 * package.json (`@nats-io/nats-core`) has it found from its entry point up.
 */
export function installedVersion(library: TrickedLibrary): string | undefined {
  try {
    const { via } = WRITTEN_FOR[library];
    let require = createRequire(__filename);
    if (via !== undefined) require = createRequire(require.resolve(via));
    try {
      return versionIn(require(`${library}/package.json`));
    } catch {
      return versionIn(manifestAbove(require.resolve(library), library));
    }
  } catch {
    return undefined;
  }
}

/** The nearest package.json above `file` that names `library`. */
function manifestAbove(file: string, library: string): unknown {
  for (let dir = dirname(file); dir !== dirname(dir); dir = dirname(dir)) {
    let manifest: unknown;
    try {
      manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
    } catch {
      continue;
    }
    if ((manifest as { name?: unknown } | null)?.name === library) return manifest;
  }
  return undefined;
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
