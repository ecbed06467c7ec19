import type { Readable } from 'node:stream';
import { MAX_TIMER_MS } from './async';
import { asError } from './errors/caught';

/**
 * How long a reader waits on its store: for `open` to give the stream, and for each next chunk.
 * The time the reader's own consumer takes between two chunks does not count.
 */
export interface StallBound {
  readonly ms: number;
  /** The error a wait past `ms` fails the read with. */
  readonly error: (waitingFor: 'open' | 'next chunk') => Error;
}

/**
 * The chunks of a store's stream (`open` opens it), for a reader of our own to pass on. Only what
 * opening it or the stream itself throws is a read failure: it goes to `onReadError`, then on.
 * When the reader stops early (it gave up, or the one it passes the chunks to destroyed it with an
 * error of its own, such as a pipeline whose destination failed), `source` is destroyed and
 * nothing is reported: that error is the reader's, and says nothing about the store.
 *
 * With `stall`, a store that does not answer within `stall.ms` fails the read too (a stalled
 * connection would otherwise hold the reader for ever): the signal given to `open` is aborted with
 * the error, a stream it still gives is destroyed, and an open stream is destroyed with it.
 */
export async function* sourceChunks(
  open: (signal?: AbortSignal) => Readable | Promise<Readable>,
  onReadError: (error: Error) => void,
  stall?: StallBound,
): AsyncGenerator<Buffer> {
  let source: Readable;
  try {
    source = await (stall ? openWithin(open, stall) : open());
  } catch (error) {
    onReadError(asError(error));
    throw error;
  }
  const chunks = source[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  try {
    for (;;) {
      let next: IteratorResult<Buffer>;
      try {
        next = await (stall ? nextWithin(chunks, source, stall) : chunks.next());
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

/** `open()`, given up on after `stall.ms`: its signal aborted, a stream it gives late destroyed. */
function openWithin(
  open: (signal?: AbortSignal) => Readable | Promise<Readable>,
  stall: StallBound,
): Promise<Readable> {
  const abandon = new AbortController();
  return new Promise<Readable>((resolve, reject) => {
    const timer = setTimeout(
      () => {
        const error = stall.error('open');
        abandon.abort(error);
        reject(error);
      },
      Math.min(stall.ms, MAX_TIMER_MS),
    );
    (async () => open(abandon.signal))().then(
      (source) => {
        clearTimeout(timer);
        if (!abandon.signal.aborted) return resolve(source);
        // Too late: nobody reads it (and an error it emits now has no listener but this one).
        source.on('error', () => undefined);
        source.destroy();
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(asError(error));
      },
    );
  });
}

/** The stream's next chunk, unless `stall.ms` pass first: then the stream is destroyed. */
async function nextWithin(
  chunks: AsyncIterator<Buffer>,
  source: Readable,
  stall: StallBound,
): Promise<IteratorResult<Buffer>> {
  let timer: NodeJS.Timeout | undefined;
  const next = chunks.next();
  const stalled = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => {
        const error = stall.error('next chunk');
        // The pending `next` rejects with it, and the iterator's `return` is free to finish.
        source.destroy(error);
        reject(error);
      },
      Math.min(stall.ms, MAX_TIMER_MS),
    );
  });
  try {
    return await Promise.race([next, stalled]);
  } finally {
    clearTimeout(timer);
    next.catch(() => undefined);
  }
}
