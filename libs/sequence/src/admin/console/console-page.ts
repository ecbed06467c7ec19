import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { extname, join } from 'node:path';
import { errorMessage } from '../../core/errors/caught';

/**
 * Where the page's files are: next to this module, in the sources (ts-node, jest) as in the build
 * (nest-cli.json copies them into dist as assets, the way it copies the Lua and SQL files).
 */
export const CONSOLE_PAGE_DIRECTORY = join(__dirname, 'page');

/** The page's one document; every other file is a stylesheet or a module it loads. */
export const CONSOLE_INDEX = 'index.html';

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  '.html': 'text/html; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.svg': 'image/svg+xml',
};

/**
 * The page loads nothing but its own files and talks to nothing but its own API: no inline script
 * or style, no other origin, no frames, no forms posting elsewhere.
 */
export const CONSOLE_CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "connect-src 'self'",
  "img-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

/** The headers every file of the page is served with. */
export const CONSOLE_SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'content-security-policy': CONSOLE_CONTENT_SECURITY_POLICY,
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
  // Always revalidated, so that an upgraded library serves its own page at once.
  'cache-control': 'no-cache',
};

export interface ConsoleFile {
  readonly body: Buffer;
  readonly contentType: string;
  readonly etag: string;
}

/**
 * Reads every file of the page once, by name. Only these names are ever served: a request cannot
 * reach another file, whatever its path.
 *
 * @throws Error naming the directory when the page's files are not there (a build that did not
 *   copy them).
 */
export function loadConsoleFiles(
  directory: string = CONSOLE_PAGE_DIRECTORY,
): ReadonlyMap<string, ConsoleFile> {
  let names: string[];
  try {
    names = readdirSync(directory);
  } catch (error) {
    throw new Error(
      `the operator console's page is not in ${directory} (${errorMessage(error)}): a build ` +
        `must copy admin/console/page/*.{html,css,js,svg} next to the compiled admin module, as ` +
        `nest-cli.json's assets do`,
    );
  }
  const files = new Map<string, ConsoleFile>();
  for (const name of names) {
    const contentType = CONTENT_TYPES[extname(name)];
    if (!contentType) continue;
    const body = readFileSync(join(directory, name));
    const etag = `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"`;
    files.set(name, { body, contentType, etag });
  }
  if (!files.has(CONSOLE_INDEX)) {
    throw new Error(`the operator console's page has no ${CONSOLE_INDEX} in ${directory}`);
  }
  return files;
}
