import { Readable } from 'node:stream';

/**
 * Runs the checks of a call that was given `payload`: when they throw, the call refuses the
 * payload before reading it, and a stream given to it (a file, say) is destroyed first, or its
 * handle would stay open.
 */
export function checkedBeforeReading<T>(payload: unknown, check: () => T): T {
  try {
    return check();
  } catch (error) {
    if (payload instanceof Readable) payload.destroy();
    throw error;
  }
}
