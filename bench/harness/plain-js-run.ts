/**
 * Runs a benchmark whose measured work happens in its own process (the outbox's writers and
 * relay, the resequencer's consumer) from the plain-JavaScript build, as a production app runs
 * compiled code. Under ts-node the TypeScript compiler stays loaded in that process: tens of MiB
 * of heap that every garbage collection of the paths measured in it works around, which weighs on
 * the path that allocates more. Both paths of a run then share the same process, as before, only
 * without the compiler.
 *
 * Started from its TypeScript source, `runBenchAsPlainJs` transpiles the sources (harness/plain-
 * js-build.ts), runs the same file's JavaScript with the same arguments and environment, and ends
 * with its exit code. The JavaScript run (or `BENCH_TS_NODE=on`, which keeps the old way) runs
 * `main` through `runBench`. The child is in a process group of its own: a Ctrl-C or SIGTERM
 * reaches it once, forwarded, and it cleans up after itself as any benchmark does.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { cleanUp, runBench } from './cleanup';
import { progress, setProgressTag } from './log';
import { buildPlainJs } from './plain-js-build';
import { choiceSetting } from './settings';

export function runBenchAsPlainJs(name: string, entry: string, main: () => Promise<void>): void {
  let tsNode: boolean;
  try {
    tsNode = choiceSetting('BENCH_TS_NODE', ['off', 'on'] as const, 'off') === 'on';
  } catch (error) {
    console.error(error);
    process.exit(1);
  }
  if (!entry.endsWith('.ts') || tsNode) {
    runBench(name, main);
    return;
  }
  setProgressTag(name);
  const exit = (code: number) => void cleanUp().then(() => process.exit(code));
  let child: ChildProcess | undefined;
  // Before the build, which takes a while: a signal meanwhile removes what it wrote.
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.on(signal, () => {
      if (!child) return exit(signal === 'SIGINT' ? 130 : 143);
      progress(`${signal}: passed on to the benchmark's process`);
      child.kill(signal);
    });
  }
  try {
    const build = buildPlainJs();
    child = fork(build.jsOf(entry), process.argv.slice(2), {
      execArgv: [...build.execArgv, ...cpuProfileArgs(process.env.BENCH_CPU_PROF_DIR)],
      env: { ...process.env, ...build.env },
      stdio: 'inherit',
      detached: true,
    });
  } catch (error) {
    console.error(error);
    return exit(1);
  }
  // A child that could not be started.
  child.once('error', (error) => {
    console.error(error);
    exit(1);
  });
  // The build's directory is this process's to remove, once the child is done with it.
  child.once('exit', (code, signal) =>
    exit(code ?? (signal === 'SIGINT' ? 130 : signal === 'SIGTERM' ? 143 : 1)),
  );
}

/** `--cpu-prof` into `dir` (BENCH_CPU_PROF_DIR), for the process that runs the paths. */
function cpuProfileArgs(dir: string | undefined): string[] {
  if (!dir) return [];
  return ['--cpu-prof', `--cpu-prof-dir=${resolve(dir)}`];
}
