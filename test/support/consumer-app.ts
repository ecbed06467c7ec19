import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';

export const ROOT = resolve(__dirname, '../..');
const TSC = require.resolve('typescript/bin/tsc');

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/**
 * This environment without what `npm test` adds for its own scripts: a nested npm must see the
 * application's directory as its project (npm_config_local_prefix names the repository), and
 * Node must find modules in the application only.
 */
function cleanEnvironment(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  for (const name of Object.keys(env)) {
    const npmOwn = /^npm_/i.test(name) && !/^npm_config_/i.test(name);
    if (npmOwn || /^npm_config_local_prefix$/i.test(name)) delete env[name];
  }
  delete env.INIT_CWD;
  delete env.NODE_PATH;
  delete env.NODE_OPTIONS;
  return env;
}

/** Runs a command to completion in `cwd`; kills it (SIGKILL) after `timeoutMs`. */
export function exec(
  command: string,
  args: string[],
  options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs: number },
): Promise<Exit> {
  return new Promise((done, fail) => {
    const child = spawn(command, args, {
      cwd: options.cwd,
      env: { ...cleanEnvironment(), ...options.env },
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: options.timeoutMs,
      killSignal: 'SIGKILL',
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', fail);
    child.on('close', (code, signal) => done({ code, signal, stdout, stderr }));
  });
}

/** Throws with everything the command printed unless it exited 0. */
export function assertSucceeded(exit: Exit, what: string): void {
  if (exit.code === 0) return;
  throw new Error(
    `${what} failed (exit ${exit.code ?? exit.signal})\n--- stdout\n${exit.stdout}\n--- stderr\n${exit.stderr}`,
  );
}

/** The version of `name` that the repository's package-lock.json installs. */
export function lockedVersion(name: string): string {
  const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, { version?: string }>;
  };
  const version = lock.packages[`node_modules/${name}`]?.version;
  if (!version) throw new Error(`${name} is not in package-lock.json: add it, or pin it here`);
  return version;
}

/** A compiler setup as an application would write it, strict and checking every declaration. */
function tsconfig(
  resolution: 'node10' | 'node16',
  include: string[],
  emit: boolean,
): Record<string, unknown> {
  return {
    compilerOptions: {
      module: resolution === 'node10' ? 'commonjs' : 'node16',
      moduleResolution: resolution,
      target: 'ES2022',
      lib: ['ES2022'],
      types: ['node'],
      strict: true,
      skipLibCheck: false,
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
      ...(emit ? { outDir: 'dist', rootDir: 'src' } : { noEmit: true }),
    },
    include,
  };
}

/**
 * A fresh application in the OS temp directory, outside the repository, that depends on the
 * tarball and on `dependencies` at the versions package-lock.json pins (so that CI installs the
 * same versions every time, mostly from npm's cache), with `files` (repository paths) in `src/`.
 *
 * - `tsconfig.json`: moduleResolution node10 (TypeScript's `node`), emitting into `dist/`;
 * - `tsconfig.node16.json`: moduleResolution node16, which reads the package's `exports`;
 * - `tsconfig.<name>.json` for each of `probes`: node10, that one file alone, not emitted.
 *
 * They compile with the repository's TypeScript: the version package-lock.json pins.
 */
export class ConsumerApp {
  private constructor(readonly dir: string) {}

  static async install(options: {
    name: string;
    tarball: string;
    dependencies: string[];
    files: Record<string, string>;
    probes?: string[];
  }): Promise<ConsumerApp> {
    const app = new ConsumerApp(mkdtempSync(join(tmpdir(), `nest-sequence-${options.name}-`)));
    const dependencies: Record<string, string> = { 'nest-sequence': `file:${options.tarball}` };
    for (const name of options.dependencies) dependencies[name] = lockedVersion(name);
    app.write('package.json', { name: options.name, private: true, dependencies });
    for (const [target, source] of Object.entries(options.files)) {
      mkdirSync(dirname(join(app.dir, target)), { recursive: true });
      copyFileSync(join(ROOT, source), join(app.dir, target));
    }
    app.write('tsconfig.json', tsconfig('node10', ['src'], true));
    app.write('tsconfig.node16.json', tsconfig('node16', ['src'], false));
    for (const probe of options.probes ?? []) {
      const name = basename(probe, '.ts');
      app.write(`tsconfig.${name}.json`, tsconfig('node10', [probe], false));
    }
    const installed = await exec(
      'npm',
      ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'],
      { cwd: app.dir, timeoutMs: 240_000 },
    );
    assertSucceeded(installed, `npm install in ${app.dir}`);
    return app;
  }

  /** Writes `content` (JSON unless a string) to `path` in the application. */
  write(path: string, content: unknown): void {
    const text = typeof content === 'string' ? content : `${JSON.stringify(content, null, 2)}\n`;
    mkdirSync(dirname(join(this.dir, path)), { recursive: true });
    writeFileSync(join(this.dir, path), text);
  }

  tsc(project: string): Promise<Exit> {
    return exec(process.execPath, [TSC, '-p', project, '--pretty', 'false'], {
      cwd: this.dir,
      timeoutMs: 120_000,
    });
  }

  node(script: string, env: NodeJS.ProcessEnv = {}): Promise<Exit> {
    return exec(process.execPath, [script], { cwd: this.dir, env, timeoutMs: 120_000 });
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
