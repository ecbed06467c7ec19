import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

export const ROOT = resolve(__dirname, '../..');

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** A demo process started in the background. */
export interface RunningProcess {
  readonly child: ChildProcessWithoutNullStreams;
  /** Everything it printed so far. */
  output(): { stdout: string; stderr: string };
  /** Resolves once stdout contains `text`; rejects if the process exits first or after `timeoutMs`. */
  waitForOutput(text: string, timeoutMs: number): Promise<void>;
  /** Resolves when it has exited. */
  readonly exited: Promise<Exit>;
}

/** Starts a command in the repository, with `env` on top of this process's environment. */
export function start(command: string, args: string[], env: NodeJS.ProcessEnv): RunningProcess {
  const child = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...env } });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<Exit>((done, fail) => {
    child.on('error', fail);
    child.on('close', (code, signal) => done({ code, signal, stdout, stderr }));
  });
  const waitForOutput = (text: string, timeoutMs: number) =>
    new Promise<void>((done, fail) => {
      const timer = setTimeout(
        () => finish(new Error(`no "${text}" within ${timeoutMs} ms`)),
        timeoutMs,
      );
      const check = () => stdout.includes(text) && finish();
      const finish = (error?: Error) => {
        clearTimeout(timer);
        child.stdout.off('data', check);
        if (error) fail(new Error(`${error.message}\nstdout: ${stdout}\nstderr: ${stderr}`));
        else done();
      };
      child.stdout.on('data', check);
      void exited.then(() => finish(new Error(`exited before printing "${text}"`)));
      check();
    });
  return { child, output: () => ({ stdout, stderr }), waitForOutput, exited };
}

/** Runs a command to completion, collecting its output. */
export function run(command: string, args: string[], env: NodeJS.ProcessEnv): Promise<Exit> {
  return start(command, args, env).exited;
}

/**
 * The command line of an npm script of this repository, to run without npm in between (so that a
 * signal sent to the child reaches the program itself), with its binary from node_modules/.bin.
 */
export function npmScript(name: string, ...extraArgs: string[]): [string, string[]] {
  const manifest = JSON.parse(readFileSync(resolve(ROOT, 'package.json'), 'utf8')) as {
    scripts: Record<string, string>;
  };
  const [binary, ...args] = manifest.scripts[name].split(' ');
  return [resolve(ROOT, 'node_modules/.bin', binary), [...args, ...extraArgs]];
}

/** Kills it (SIGKILL) if it is still running, and waits until it has exited: after a test. */
export async function killIfRunning(running: RunningProcess | undefined): Promise<void> {
  if (running && running.child.exitCode === null && running.child.signalCode === null) {
    running.child.kill('SIGKILL');
    await running.exited;
  }
}

/** Sends SIGTERM and resolves to how it ended: its exit code, signal and stderr. */
export async function terminate(
  running: RunningProcess,
): Promise<Pick<Exit, 'code' | 'signal' | 'stderr'>> {
  running.child.kill('SIGTERM');
  const { code, signal, stderr } = await running.exited;
  return { code, signal, stderr };
}
