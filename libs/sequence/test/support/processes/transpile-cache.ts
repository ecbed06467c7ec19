/*
 * Imported first by the fixture processes (before the library): keeps what ts-node
 * compiles on disk, keyed by each file's path and content (and the compiler and its settings),
 * so that only the first process to load a file version compiles it. Without it each fixture
 * process spends seconds of CPU compiling the library again, which is most of a fault test's
 * time when several processes start.
 *
 * Stack traces of a file loaded from the cache are not source-mapped (line numbers are the
 * compiled ones); fixtures report through their results file, not through stack traces.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

interface CompilingModule extends NodeJS.Module {
  _compile(code: string, filename: string): unknown;
}

const CACHE_DIR = join(tmpdir(), 'nseq-fault-transpile-cache');

/** What else decides the compiled code: the compiler's version and settings. */
function compilerKey(): string {
  const tsconfig = process.env.TS_NODE_PROJECT ?? 'tsconfig.json';
  return [
    readFileSync(require.resolve('typescript/package.json'), 'utf8'),
    readFileSync(require.resolve('ts-node/package.json'), 'utf8'),
    readFileSync(tsconfig, 'utf8'),
    process.env.TS_NODE_COMPILER_OPTIONS ?? '',
  ].join('\0');
}

function install(): void {
  const compileTs = require.extensions['.ts'];
  if (!compileTs) return; // not under ts-node: nothing to cache
  const compiler = createHash('sha256').update(compilerKey()).digest('hex');
  mkdirSync(CACHE_DIR, { recursive: true });

  require.extensions['.ts'] = (module: NodeJS.Module, filename: string): void => {
    const key = createHash('sha256')
      .update(compiler)
      .update(filename)
      .update(readFileSync(filename))
      .digest('hex');
    const cached = join(CACHE_DIR, `${key}.js`);
    const loading = module as CompilingModule;
    let code: string | undefined;
    try {
      code = readFileSync(cached, 'utf8');
    } catch {
      // Not compiled yet: ts-node compiles it below.
    }
    if (code !== undefined) {
      loading._compile(code, filename);
      return;
    }
    const compile = loading._compile;
    // ts-node wraps `_compile` and calls the function it found with the compiled code.
    loading._compile = function (this: CompilingModule, compiled: string, name: string) {
      // Written whole, then renamed: processes loading at once never read half a file.
      const partial = `${cached}.${process.pid}`;
      writeFileSync(partial, compiled);
      renameSync(partial, cached);
      return compile.call(this, compiled, name);
    };
    compileTs(module, filename);
  };
}

install();
