import type { Socket } from 'node:net';

/** What a socket has written since {@link countSocketWrites}: system calls, and chunks in them. */
export interface SocketWriteCounts {
  writes: number;
  chunks: number;
}

/**
 * Counts the writes a socket hands to the operating system from now on: one per `_write` (a
 * single chunk) or `_writev` (several chunks in one call, as a corked socket flushes them).
 */
export function countSocketWrites(socket: Socket): SocketWriteCounts {
  const counts: SocketWriteCounts = { writes: 0, chunks: 0 };
  const target = socket as unknown as {
    _write: (...args: unknown[]) => void;
    _writev: (chunks: unknown[], callback: unknown) => void;
  };
  const write = target._write;
  const writev = target._writev;
  target._write = function (...args: unknown[]) {
    counts.writes++;
    counts.chunks++;
    return write.apply(this, args);
  };
  target._writev = function (chunks: unknown[], callback: unknown) {
    counts.writes++;
    counts.chunks += chunks.length;
    return writev.call(this, chunks, callback);
  };
  return counts;
}
