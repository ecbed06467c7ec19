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
  const stream =
    payload instanceof Readable
      ? payload
      : isRecordSource(payload) && payload.records instanceof Readable
        ? payload.records
        : undefined;
  if (!stream) return;
  stream.on('error', () => undefined);
  stream.destroy();
}
