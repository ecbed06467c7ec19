/**
 * What every benchmark child process says to its parent over IPC, whatever its benchmark: that it
 * is ready, or that it failed. A benchmark's own messages (arm a run, a run's figures, ...) come
 * on top, in its `*.protocol.ts`. Messages are objects with a `type`.
 *
 * Lifecycle: the parent forks the child with one argument, its JSON configuration; the child
 * starts, connects, and sends `ready`; the parent and the child exchange the benchmark's messages;
 * the parent stops the child with SIGTERM (then SIGKILL after a grace period), on which the child
 * closes what it opened and exits 0. A child whose parent is gone (the IPC channel closed) exits
 * at once; a child ignores SIGINT, so that Ctrl-C in a terminal, which reaches the whole process
 * group, leaves the stopping to the parent's cleanup.
 */
export interface ChildMessage {
  readonly type: string;
}

/** Started and connected: its pid and RSS then, before any work, plus what its benchmark adds. */
export type ChildReady<Extra extends object = object> = {
  readonly type: 'ready';
  readonly pid: number;
  readonly idleRssMiB: number;
} & Extra;

/** The child failed (and exits 1): whatever the parent waits for from it fails with `message`. */
export interface ChildFailure {
  readonly type: 'error';
  readonly message: string;
}
