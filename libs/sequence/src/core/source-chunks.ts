import type { Readable } from 'node:stream';
import { asError } from './errors/caught';

/**
 * The chunks of a store's stream (`open` opens it), for a reader of our own to pass on. Only what
 * opening it or the stream itself throws is a read failure: it goes to `onReadError`, then on. When the reader stops early (it
 * gave up, or the one it passes the chunks to destroyed it with an error of its own, such as a
 * pipeline whose destination failed), `source` is destroyed and nothing is reported: that error
 * is the reader's, and says nothing about the store.
 */
export async function* sourceChunks(
  open: () => Readable | Promise<Readable>,
  onReadError: (error: Error) => void,
): AsyncGenerator<Buffer> {
  let source: Readable;
  try {
    source = await open();
  } catch (error) {
    onReadError(asError(error));
    throw error;
  }
  const chunks = source[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  try {
    for (;;) {
      let next: IteratorResult<Buffer>;
      try {
        next = await chunks.next();
      } catch (error) {
        onReadError(asError(error));
        throw error;
      }
      if (next.done) return;
      yield next.value;
    }
  } finally {
    // Destroys the store's stream when the read stopped early; nothing once it ended.
    await chunks.return?.();
  }
}
