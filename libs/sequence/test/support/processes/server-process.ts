import type { ChildProcess } from 'node:child_process';

/**
 * Resolves once `answers()` says the server `child` runs is up. Kills it (SIGKILL) and rejects
 * when it exits first or `timeoutMs` passes: the caller reports why, with the server's output.
 */
export async function awaitAnswering(
  child: ChildProcess,
  answers: () => Promise<boolean>,
  timeoutMs: number,
  intervalMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await answers())) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(child.exitCode !== null ? 'the server exited' : 'the server did not answer');
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Sends `signal` to `child` unless it has already exited, and resolves once it has. */
export async function stopProcess(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill(signal);
  await exited;
}
