import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Cluster, Redis } from 'ioredis';
import { FRAGMENT_OVERHEAD_BYTES, SEQUENCE_OVERHEAD_BYTES } from '../../../core/completeness';
import { CLOSED_KEY_NEXT } from '../../../ports/resequencer-store.port';

export type RedisClient = Redis | Cluster;

/**
 * The Lua scripts of the store, one per atomic step (files `lua/<name>-<numberOfKeys>.lua`, or
 * `lua/<name>-n.lua` for one that takes any number of keys).
 */
export type ScriptName =
  | 'accept'
  | 'renew-lease'
  | 'release-lease'
  | 'finish'
  | 'expire'
  | 'drop-retained'
  | 'reserve'
  | 'settle'
  | 'forget'
  | 'release-retained'
  | 'stats'
  | 'inspect'
  | 'clock'
  | 'claim-acquire'
  | 'claim-complete'
  | 'claim-release'
  | 'payload-delete-unpublished'
  | 'rsq-accept'
  | 'rsq-accept-ix'
  | 'rsq-accept-batch'
  | 'rsq-claim'
  | 'rsq-settle'
  | 'rsq-settle-ix'
  | 'rsq-settle-batch'
  | 'rsq-release'
  | 'rsq-renew'
  | 'rsq-resolve'
  | 'rsq-resolve-ix'
  | 'rsq-retire'
  | 'rsq-retire-ix'
  | 'rsq-unindex'
  | 'rsq-inspect'
  | 'rsq-gaps'
  | 'rsq-expiring'
  | 'rsq-gap-stats'
  | 'rsq-index'
  | 'rsq-prune';

export type ScriptArgument = string | number | Buffer;

/** Runs one script: keys first (as many as its file name says, or any for "-n"), then arguments. */
export type Script = (keys: readonly string[], args: readonly ScriptArgument[]) => Promise<unknown>;

export type Scripts = Readonly<Record<ScriptName, Script>>;

/** Next to this file in the sources (ts-jest) and in the build (nest-cli assets). */
const LUA_DIRECTORY = join(__dirname, 'lua');
const SCRIPT_FILE = /^([a-z-]+)-(\d+|n)\.lua$/;
const INCLUDE = /^--- @include "(_[a-z-]+)"$/gm;

type CustomCommand = (...keysAndArgs: ScriptArgument[]) => Promise<unknown>;

const loaded = new WeakMap<RedisClient, Scripts>();

/**
 * Defines the store's scripts on `client` (once per client: `defineCommand` keeps each script's
 * SHA and falls back to EVAL when the server does not have it yet, on every cluster node).
 * Lines `--- @include "_name"` are replaced by `lua/_name.lua`.
 */
export function loadScripts(client: RedisClient): Scripts {
  const known = loaded.get(client);
  if (known) return known;

  const scripts: Partial<Record<ScriptName, Script>> = {};
  for (const file of readdirSync(LUA_DIRECTORY)) {
    const match = SCRIPT_FILE.exec(file);
    if (!match) continue;
    const [, name, keys] = match;
    const command = `nseq_${name.replace(/-/g, '_')}`;
    if (keys === 'n') {
      // Without numberOfKeys, ioredis takes the number of keys as the first argument.
      client.defineCommand(command, { lua: readLua(file) });
      const run = (client as unknown as Record<string, CustomCommand>)[command].bind(client);
      scripts[name as ScriptName] = (keyList, args) => run(keyList.length, ...keyList, ...args);
      continue;
    }
    const numberOfKeys = Number(keys);
    client.defineCommand(command, { lua: readLua(file), numberOfKeys });
    const run = (client as unknown as Record<string, CustomCommand>)[command].bind(client);
    scripts[name as ScriptName] = (keyList, args) => {
      if (keyList.length !== numberOfKeys) {
        throw new Error(`script ${name} takes ${numberOfKeys} keys, was given ${keyList.length}`);
      }
      return run(...keyList, ...args);
    };
  }
  const missing = SCRIPT_NAMES.filter((name) => !scripts[name]);
  if (missing.length > 0) {
    throw new Error(`Lua scripts missing from ${LUA_DIRECTORY}: ${missing.join(', ')}`);
  }
  loaded.set(client, scripts as Scripts);
  return scripts as Scripts;
}

const SCRIPT_NAMES: readonly ScriptName[] = [
  'accept',
  'renew-lease',
  'release-lease',
  'finish',
  'expire',
  'drop-retained',
  'reserve',
  'settle',
  'forget',
  'release-retained',
  'stats',
  'inspect',
  'clock',
  'claim-acquire',
  'claim-complete',
  'claim-release',
  'payload-delete-unpublished',
  'rsq-accept',
  'rsq-accept-ix',
  'rsq-accept-batch',
  'rsq-claim',
  'rsq-settle',
  'rsq-settle-ix',
  'rsq-settle-batch',
  'rsq-release',
  'rsq-renew',
  'rsq-resolve',
  'rsq-resolve-ix',
  'rsq-retire',
  'rsq-retire-ix',
  'rsq-unindex',
  'rsq-inspect',
  'rsq-gaps',
  'rsq-expiring',
  'rsq-index',
  'rsq-prune',
  'rsq-gap-stats',
];

/** Values the scripts share with the TypeScript rules they mirror: `{{NAME}}` in the Lua. */
const CONSTANTS: Readonly<Record<string, number>> = {
  SEQUENCE_OVERHEAD_BYTES,
  FRAGMENT_OVERHEAD_BYTES,
  CLOSED_KEY_NEXT,
};
const CONSTANT = /\{\{([A-Z_]+)\}\}/g;

function readLua(file: string): string {
  return readFileSync(join(LUA_DIRECTORY, file), 'utf8')
    .replace(INCLUDE, (_line, include: string) =>
      readFileSync(join(LUA_DIRECTORY, `${include}.lua`), 'utf8'),
    )
    .replace(CONSTANT, (_match, name: string) => {
      const value = CONSTANTS[name];
      if (value === undefined) throw new Error(`${file}: unknown constant {{${name}}}`);
      return String(value);
    });
}
