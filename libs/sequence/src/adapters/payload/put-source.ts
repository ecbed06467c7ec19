import { Readable } from 'node:stream';
import { holdSourceErrors } from '../../core/refused-source';

/**
 * Runs a store's `put` of `payload`: holds the source's errors, as its own I/O may come first
 * (see {@link holdSourceErrors}), and, when the put rejects, destroys a source stream, whether
 * the store refused before reading it (its options, its backing service unreachable) or failed
 * part-way. The caller's stream (a file, an upload's socket) is never left open behind a
 * rejected put.
 */
export async function putFromSource<T>(
  payload: Buffer | Readable,
  put: () => Promise<T>,
): Promise<T> {
  holdSourceErrors(payload);
  try {
    return await put();
  } catch (error) {
    if (payload instanceof Readable) payload.destroy();
    throw error;
  }
}
