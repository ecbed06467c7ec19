/**
 * Transpiles the library and the benchmark sources to plain JavaScript in a temporary directory,
 * so that a measured process runs without ts-node: the TypeScript compiler that ts-node keeps
 * loaded would otherwise count in that process's RSS (tens of MiB that are not the library's).
 * Same transform as `ts-node --transpile-only` (isolated modules, decorator metadata), from the
 * same tsconfig.json. The Lua scripts of the Redis store and the SQL statements of the PostgreSQL
 * store are copied next to their loaders. The output is removed when the benchmark ends
 * (cleanup.ts).
 */
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import * as ts from 'typescript';
import { onCleanup } from './cleanup';

export interface PlainJsBuild {
  /** Root of the output. */
  readonly dir: string;
  /** Path of `file` (a .ts file under `root`) in the output, as .js. */
  jsOf(file: string): string;
  /** Node options that resolve `nest-sequence` and its subpaths in the output, as `paths` do. */
  readonly execArgv: string[];
  readonly env: Record<string, string>;
}

const SOURCE_DIRECTORIES = ['libs/sequence/src', 'bench'];

/** The repository's root. */
export const PROJECT_ROOT = resolve(__dirname, '..', '..');

export function buildPlainJs(root = PROJECT_ROOT): PlainJsBuild {
  const dir = mkdtempSync(join(tmpdir(), 'nseq-bench-js-'));
  onCleanup('remove the plain-JS build', () => rmSync(dir, { recursive: true, force: true }));
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), (path) => ts.sys.readFile(path));
  if (config.error)
    throw new Error(ts.flattenDiagnosticMessageText(config.error.messageText, '\n'));
  const { options } = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  const compilerOptions: ts.CompilerOptions = {
    ...options,
    module: ts.ModuleKind.CommonJS,
    sourceMap: false,
    inlineSourceMap: false,
    declaration: false,
    noEmit: false,
  };

  for (const sourceDirectory of SOURCE_DIRECTORIES) {
    for (const file of walk(join(root, sourceDirectory))) {
      const target = join(dir, relative(root, file));
      mkdirSync(dirname(target), { recursive: true });
      if (file.endsWith('.lua') || file.endsWith('.sql')) {
        copyFileSync(file, target);
      } else if (file.endsWith('.ts') && !file.endsWith('.d.ts') && !file.includes('.spec.')) {
        const { outputText } = ts.transpileModule(readFileSync(file, 'utf8'), {
          compilerOptions,
          fileName: file,
        });
        writeFileSync(target.replace(/\.ts$/, '.js'), outputText);
      }
    }
  }

  const hook = join(dir, 'resolve-paths.js');
  writeFileSync(
    hook,
    `'use strict';
const Module = require('module');
const path = require('path');
const aliases = new Map(Object.entries(${JSON.stringify(aliasesOf(options, root))}));
const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  const alias = aliases.get(request);
  return resolve.call(this, alias === undefined ? request : path.join(__dirname, alias), ...rest);
};
`,
  );
  return {
    dir,
    jsOf: (file) => join(dir, relative(root, file)).replace(/\.ts$/, '.js'),
    execArgv: ['-r', hook],
    env: { NODE_PATH: join(root, 'node_modules') },
  };
}

/**
 * The `paths` of tsconfig.json (the `nest-sequence` entry points), each as its first target's
 * path in the output, without extension: the same names resolve in the build as in the sources.
 */
function aliasesOf(options: ts.CompilerOptions, root: string): Record<string, string> {
  const aliases: Record<string, string> = {};
  for (const [name, targets] of Object.entries(options.paths ?? {})) {
    if (name.includes('*') || targets.length === 0) continue;
    const target = resolve(options.baseUrl ?? root, targets[0]);
    aliases[name] = relative(root, target).replace(/\.ts$/, '');
  }
  return aliases;
}

function* walk(directory: string): Generator<string> {
  for (const entry of readdirSync(directory, { withFileTypes: true })) {
    const path = join(directory, entry.name);
    if (entry.isDirectory()) yield* walk(path);
    else yield path;
  }
}
