import { Readable } from 'node:stream';

/**
 * Called by a store's `put` before its first await. A source stream that fails while the store
 * is still at its own I/O (a directory, a transaction, a marker), as an aborted upload or a file
 * that cannot be opened does, would emit `'error'` with no listener: an uncaught exception that
 * ends the process. With this listener the stream keeps the error (`readable.errored`) and the
 * store's later read of it rejects with it, so `put` does.
 */
function holdSourceErrors(payload: Buffer | Readable): void {
  if (payload instanceof Readable) payload.once('error', keptByTheStream);
}

function keptByTheStream(): void {
  // The stream holds the error for whoever reads it.
}

/**
 * Runs a store's `put` of `payload`: holds the source's errors (see {@link holdSourceErrors})
 * and, when the put rejects, destroys a source stream, whether the store refused before reading
 * it (its options, its backing service unreachable) or failed part-way. The caller's stream (a
 * file, an upload's socket) is never left open behind a rejected put.
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
