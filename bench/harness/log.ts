/**
 * Where a benchmark's words go: stdout carries only its JSON result lines (report.ts), so
 * progress and diagnostics go to stderr (and Nest's log lines too: nest-logger.ts). Loads nothing
 * but Node: the baseline child processes use it, and must stay free of Nest and the library.
 */

let tag = 'bench';

/** Names the benchmark in its progress lines (`[bench:<name>] ...`); runBench sets it. */
export function setProgressTag(name: string): void {
  tag = `bench:${name}`;
}

/** One line of progress or diagnostics, on stderr. */
export function progress(line: string): void {
  process.stderr.write(`[${tag}] ${line}\n`);
}

export function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
