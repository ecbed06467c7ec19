import { Readable } from 'node:stream';
import { isRecordSource } from './payload-source';

/**
 * Runs the checks of a call that was given `payload`: when they throw, the call refuses the
 * payload before reading it, and a stream given to it (a file, say; or the records stream of a
 * record source) is destroyed first, or its handle would stay open.
 */
export function checkedBeforeReading<T>(payload: unknown, check: () => T): T {
  try {
    return check();
  } catch (error) {
    destroySource(payload);
    throw error;
  }
}

/**
 * Destroys `payload` when it is (or its records are) a Readable; other sources are left alone.
 * What the stream reports after that (a file that failed to open) is nobody's any more: it is
 * listened to, or it would be an uncaught exception.
 */
export function destroySource(payload: unknown): void {
  const stream = streamOf(payload);
  if (!stream) return;
  stream.on('error', ignored);
  stream.destroy();
}

/**
 * Holds the first error of `payload`'s stream (it, or its records) for whoever reads it later:
 * a call that awaits something else first (a reply channel, a store) leaves a stream that fails
 * meanwhile (a file that cannot be opened) with no listener, an uncaught exception. The stream
 * keeps the error (`errored`), and its reader gets it.
 */
export function holdSourceErrors(payload: unknown): void {
  streamOf(payload)?.once('error', ignored);
}

function streamOf(payload: unknown): Readable | undefined {
  if (payload instanceof Readable) return payload;
  if (isRecordSource(payload) && payload.records instanceof Readable) return payload.records;
  return undefined;
}

function ignored(): void {
  // The stream keeps the error for its reader; destroyed, it has none.
}
