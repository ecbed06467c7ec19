import type { Writable } from 'node:stream';

/**
 * amqplib's connection has each channel write its frames into a buffer of its own; a multiplexer
 * then copies them to the socket on the next turn of the event loop, one `socket.write` (one
 * system call, one TCP segment) per frame: publishes, their confirms' counterpart acks, consumer
 * acks. {@link coalesceFrameWrites} corks the socket around that copy, so the frames of one pass
 * leave in one `writev`. The same bytes leave, in the same order, in the same turn of the event
 * loop. Back-pressure stays intact but starts earlier: a corked socket answers `false` once the
 * pass has buffered its high-water mark (16 KiB), so the multiplexer then stops and resumes on
 * `'drain'`, after the `writev`. Large messages (128 KiB frames) thus still leave about one frame
 * per write, as before; small ones leave up to 16 KiB per write.
 *
 * On a 2-core VM, where each write to a loopback socket also wakes the broker, this took the
 * resequencer benchmark's RabbitMQ and process CPU per event down (docs/benchmarks.md).
 *
 * amqplib does not export the multiplexer: this reaches `connection.muxer`, an internal of
 * amqplib 0.10, and does nothing (returns false) when the shape is not the one it knows. The
 * transport applies it only with `unsafeSocketTricks`, and only on amqplib 0.10.x
 * (socket-tricks.guard.ts).
 */
interface Multiplexer {
  out: Writable;
  _readIncoming: (this: Multiplexer) => void;
}

const coalesced = new WeakSet<object>();

function multiplexerOf(model: unknown): Partial<Multiplexer> | undefined {
  const connection = (model as { connection?: { muxer?: unknown } } | undefined)?.connection;
  return connection?.muxer as Partial<Multiplexer> | undefined;
}

/** Whether {@link coalesceFrameWrites} has been applied to this amqplib `ChannelModel`. */
export function framesCoalesced(model: unknown): boolean {
  const mux = multiplexerOf(model);
  return mux !== undefined && coalesced.has(mux);
}

/**
 * @param model amqplib's `ChannelModel` (what amqp-connection-manager's `connection` is).
 * @returns whether the connection's frame writes are (now or already) coalesced.
 */
export function coalesceFrameWrites(model: unknown): boolean {
  const mux = multiplexerOf(model);
  if (!mux) return false;
  if (coalesced.has(mux)) return true;
  const flush = mux._readIncoming;
  const out = mux.out;
  if (
    typeof flush !== 'function' ||
    typeof out?.cork !== 'function' ||
    typeof out.uncork !== 'function'
  ) {
    return false;
  }
  mux._readIncoming = function (this: Multiplexer) {
    out.cork();
    try {
      flush.call(this);
    } finally {
      out.uncork();
    }
  };
  coalesced.add(mux);
  return true;
}
