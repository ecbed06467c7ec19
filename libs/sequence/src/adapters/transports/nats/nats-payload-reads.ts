/**
 * The NATS client (`@nats-io/nats-core` 3) parses the bytes of each socket read as they come. A
 * message payload that spans reads (any large one: Node reads a socket 64 KiB at a time) is
 * gathered in a growing buffer that starts with a copy of what the first read held and doubles
 * when full, copying what it has into each new one: for a 1 MiB payload about 3.6 MiB of fresh,
 * zero-filled memory and two to three copies of each byte. In a consumer of large fragments that
 * was more CPU than everything else it did with the bytes but hashing, and the garbage collector
 * ran full collections for the discarded buffers.
 *
 * {@link assemblePayloadsInPlace} has the connection gather each payload of
 * {@link IN_PLACE_MIN_BYTES} or more in one buffer of the size its `MSG`/`HMSG` line announced,
 * taken from the connection's {@link BodyPool}: each byte is copied once, from the socket's read
 * into the payload (the first read's part twice: the client has copied it before the buffer is
 * replaced). A payload whose message was released (`recycleBody`, through the transport's
 * `releaseBody`) goes back to the pool, and a later payload is written into it.
 *
 * The client does not expose its parser: this wraps `parse` of the connection's protocol handler's
 * `parser` (and of each parser it makes after a reconnect), internals of `@nats-io/nats-core` 3.x,
 * and replaces the growing buffer's memory (`msgBuf._buf`) right after the parser started it, before
 * anything else is written to it. A parser or buffer not of the shape it knows is left as it is.
 * The transport applies it only with `unsafeSocketTricks`, and only on `@nats-io/nats-core` 3.x
 * (socket-tricks.guard.ts).
 */

import { BodyPool } from '../body-pool';

/** Payloads from this size are gathered in place; smaller ones are left to the client. */
export const IN_PLACE_MIN_BYTES = 64 * 1024;

/** nats-core 3's parser, as far as this reaches it. */
interface PayloadParser {
  parse(this: PayloadParser, chunk: Uint8Array): void;
  /** The buffer a payload spanning socket reads is gathered in (a DenoBuffer), while it is. */
  msgBuf?: unknown;
  /** The message line being parsed: `size` is its payload's length, headers included. */
  ma?: { size?: unknown };
}

/** nats-core 3's DenoBuffer: its bytes are `_buf[_off:]`, and it grows within `_buf.buffer`. */
interface GrowingBuffer {
  _buf: Uint8Array;
  _off: number;
}

const applied = new WeakSet<object>();

function protocolOf(connection: unknown): object | undefined {
  const protocol = (connection as { protocol?: unknown } | undefined)?.protocol;
  return typeof protocol === 'object' && protocol !== null ? protocol : undefined;
}

function isParser(value: unknown): value is PayloadParser {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { parse?: unknown }).parse === 'function'
  );
}

function isGrowingBuffer(value: unknown): value is GrowingBuffer {
  const candidate = value as Partial<GrowingBuffer> | undefined;
  return (
    typeof candidate === 'object' &&
    candidate !== null &&
    candidate._buf instanceof Uint8Array &&
    typeof candidate._off === 'number'
  );
}

/** Whether {@link assemblePayloadsInPlace} has been applied to this `NatsConnection`. */
export function payloadsAssembledInPlace(connection: unknown): boolean {
  const protocol = protocolOf(connection);
  return protocol !== undefined && applied.has(protocol);
}

/**
 * @param connection a `NatsConnection` of `@nats-io/transport-node` 3.
 * @returns whether its large payloads are (now or already) gathered in place.
 */
export function assemblePayloadsInPlace(connection: unknown): boolean {
  const protocol = protocolOf(connection);
  if (!protocol) return false;
  if (applied.has(protocol)) return true;
  const descriptor = Object.getOwnPropertyDescriptor(protocol, 'parser');
  if (!descriptor?.writable || !descriptor.configurable || !isParser(descriptor.value)) {
    return false;
  }
  const pool = new BodyPool();
  let current: unknown = gatherInPlace(descriptor.value, pool);
  // The protocol handler makes a new parser when it reconnects: each is wrapped as it is set.
  Object.defineProperty(protocol, 'parser', {
    configurable: true,
    enumerable: descriptor.enumerable,
    get: () => current,
    set: (next: unknown) => {
      current = isParser(next) ? gatherInPlace(next, pool) : next;
    },
  });
  applied.add(protocol);
  return true;
}

/** Wraps `parser.parse` so that each large payload's growing buffer gets a whole body at once. */
function gatherInPlace(parser: PayloadParser, pool: BodyPool): PayloadParser {
  const parse = parser.parse;
  /** The growing buffer last looked at: the parser keeps one object per payload. */
  let seen: unknown;
  parser.parse = function (this: PayloadParser, chunk: Uint8Array): void {
    parse.call(this, chunk);
    const pending = this.msgBuf;
    if (pending === undefined || pending === seen) return;
    seen = pending;
    const size = this.ma?.size;
    if (
      !isGrowingBuffer(pending) ||
      typeof size !== 'number' ||
      !Number.isSafeInteger(size) ||
      size < IN_PLACE_MIN_BYTES
    ) {
      return;
    }
    const received = pending._buf.subarray(pending._off);
    if (received.byteLength >= size) return;
    const body = pool.take(size);
    body.set(received, 0);
    // The buffer grows within its memory block up to its capacity: from here on, no new one.
    pending._buf = new Uint8Array(body.buffer, 0, received.byteLength);
    pending._off = 0;
  };
  return parser;
}
