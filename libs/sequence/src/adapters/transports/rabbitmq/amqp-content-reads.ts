/**
 * amqplib receives a message's body in frames of at most the negotiated `frameMax` (128 KiB by
 * default). It gathers each frame by concatenating what it has with every socket read until the
 * frame is whole (a 128 KiB frame from 64 KiB reads: about 1.5 copies of each byte), keeps every
 * frame until the body's last one, then copies them all into the message's `content`
 * (`Buffer.concat`): two to three new buffers per byte received, each on fresh memory pages.
 * On a virtual machine touching a fresh page is expensive (with 8 MiB messages the copy into
 * `content` took ten times as long in a consumer as the same copy into reused memory), and the
 * buffers, kept alive across garbage collections while a large body arrives, have the garbage
 * collector run full collections for them.
 *
 * {@link assembleContentInPlace} has the connection write each large body (from
 * {@link IN_PLACE_MIN_BYTES}) into one buffer of the size its header frame announced, as its
 * frames' bytes are read from the socket, and hand amqplib that buffer as the body's single frame:
 * amqplib then takes it as `content` without a copy. Each byte is copied once, from the socket's
 * read into the body. With `recycleBody` (body-pool.ts; the transport's `releaseBody`), a body
 * nothing refers to any more goes back to its connection and the next large body is written into
 * it, so a consumer that releases its bodies (broker-held reassembly) reuses a few buffers instead
 * of allocating new ones. A frame sequence that is not the one expected (a body frame larger than
 * what is left, another frame in the middle of a body) is handed to amqplib as it came, so that
 * amqplib meets and reports it as it would have.
 *
 * amqplib does not expose its frame handling: this wraps `connection.recvFrame` and
 * `connection.accept`, internals of amqplib 0.10 (the function its socket loop reads the next
 * frame with, and the one it hands each frame to once the connection is open), and does nothing
 * (returns false) when the shape is not the one it knows. The transport applies it only with
 * `unsafeSocketTricks`, and only on amqplib 0.10.x (socket-tricks.guard.ts).
 */

import { BodyPool } from '../body-pool';

/** amqplib 0.10's decoded frame: a method (`id`, `fields`), a header (`id`, `size`), a body. */
interface DecodedFrame {
  readonly channel: number;
  readonly id?: number;
  readonly size?: number;
  readonly content?: Buffer;
}

/** The parts of amqplib 0.10's `Connection` this reaches. */
interface FrameAcceptor {
  accept: (this: FrameAcceptor, frame: DecodedFrame) => unknown;
  recvFrame: (this: FrameAcceptor) => DecodedFrame | false;
  rest: Buffer;
  recvSinceLastCheck: boolean;
  stream: { read(): Buffer | null };
  /** The negotiated largest frame; amqplib before 0.10.7 refuses a frame over it. */
  frameMax?: number;
}

/** AMQP 0-9-1 frame layout: type (1), channel (2), payload size (4), payload, end (1). */
const FRAME_HEADER_BYTES = 7;
const FRAME_BODY = 3;
const FRAME_END = 0xce;

/** AMQP 0-9-1 `basic` content header class id: amqplib's `defs.BasicProperties`. */
const BASIC_PROPERTIES = 60;

/**
 * Bodies up to this size are left to amqplib: they come in one or two frames, which it copies
 * once at most anyway.
 */
export const IN_PLACE_MIN_BYTES = 256 * 1024;

/** Bodies over RabbitMQ's largest `max_message_size` (512 MiB) are left to amqplib too. */
const IN_PLACE_MAX_BYTES = 512 * 1024 * 1024;

/** A body being filled on one channel. */
interface Filling {
  readonly body: Buffer;
  filled: number;
}

const assembled = new WeakSet<object>();

function connectionOf(model: unknown): Partial<FrameAcceptor> | undefined {
  const connection = (model as { connection?: unknown } | undefined)?.connection;
  return typeof connection === 'object' && connection !== null ? connection : undefined;
}

/** Whether {@link assembleContentInPlace} has been applied to this amqplib `ChannelModel`. */
export function contentAssembledInPlace(model: unknown): boolean {
  const connection = connectionOf(model);
  return connection !== undefined && assembled.has(connection);
}

/**
 * @param model amqplib's `ChannelModel` (what amqp-connection-manager's `connection` is), open.
 * @returns whether the connection's large bodies are (now or already) assembled in place.
 */
export function assembleContentInPlace(model: unknown): boolean {
  const connection = connectionOf(model);
  if (!connection) return false;
  if (assembled.has(connection)) return true;
  const accept = connection.accept;
  const recvFrame = connection.recvFrame;
  if (
    typeof accept !== 'function' ||
    typeof recvFrame !== 'function' ||
    !Buffer.isBuffer(connection.rest) ||
    typeof connection.stream?.read !== 'function'
  ) {
    return false;
  }
  const filling = new Map<number, Filling>();
  const pool = new BodyPool();
  /** The body frame whose payload is being copied into place as it is read, and what is left. */
  let streaming: { readonly channel: number; readonly into: Filling; left: number } | undefined;

  /** Appends the socket's next read to `rest`; false when there is none. */
  function readMore(self: FrameAcceptor): boolean {
    const incoming = self.stream.read();
    if (incoming === null) return false;
    self.recvSinceLastCheck = true;
    self.rest = self.rest.length === 0 ? incoming : Buffer.concat([self.rest, incoming]);
    return true;
  }

  /**
   * amqplib's `recvFrame`, except for a body frame of a body being assembled in place that has
   * not fully arrived: its payload is copied into place as the socket's reads come, instead of
   * being gathered first (amqplib concatenates what it has with each read until the frame is
   * whole). The frames it returns are amqplib's own; for a body frame copied this way it returns
   * nothing, or, with the body's last byte, the whole body as one frame.
   */
  connection.recvFrame = function (this: FrameAcceptor): DecodedFrame | false {
    for (;;) {
      if (streaming) {
        const { into } = streaming;
        if (streaming.left > 0) {
          const take = Math.min(streaming.left, this.rest.length);
          this.rest.copy(into.body, into.filled, 0, take);
          into.filled += take;
          streaming.left -= take;
          this.rest = this.rest.subarray(take);
          if (streaming.left > 0) {
            if (!readMore(this)) return false;
            continue;
          }
        }
        if (this.rest.length === 0 && !readMore(this)) return false;
        if (this.rest[0] !== FRAME_END) throw new Error('Invalid frame');
        this.rest = this.rest.subarray(1);
        const { channel } = streaming;
        streaming = undefined;
        if (into.filled < into.body.length) continue;
        filling.delete(channel);
        return { channel, content: into.body };
      }
      const rest = this.rest;
      if (rest.length >= FRAME_HEADER_BYTES && rest[0] === FRAME_BODY) {
        const channel = rest.readUInt16BE(1);
        const size = rest.readUInt32BE(3);
        const into = filling.get(channel);
        if (
          into &&
          size <= into.body.length - into.filled &&
          // A frame over the negotiated maximum goes to amqplib, to be refused as it would be.
          (typeof this.frameMax !== 'number' || size <= this.frameMax) &&
          rest.length < FRAME_HEADER_BYTES + size + 1
        ) {
          streaming = { channel, into, left: size };
          this.rest = rest.subarray(FRAME_HEADER_BYTES);
          continue;
        }
      } else if (rest.length < FRAME_HEADER_BYTES && filling.size > 0) {
        // Not enough to tell: read on, to see whether it is a body frame to stream.
        if (!readMore(this)) return false;
        continue;
      }
      return recvFrame.call(this);
    }
  };
  connection.accept = function (this: FrameAcceptor, frame: DecodedFrame): unknown {
    if (frame.id === undefined && frame.content !== undefined) {
      const pending = filling.get(frame.channel);
      if (!pending) return accept.call(this, frame);
      const { content } = frame;
      if (content.length > pending.body.length - pending.filled) {
        // More than announced: amqplib's own checks see the frames as they came.
        filling.delete(frame.channel);
        if (pending.filled > 0) {
          accept.call(this, {
            channel: frame.channel,
            content: pending.body.subarray(0, pending.filled),
          });
        }
        return accept.call(this, frame);
      }
      content.copy(pending.body, pending.filled);
      pending.filled += content.length;
      if (pending.filled < pending.body.length) return undefined;
      filling.delete(frame.channel);
      return accept.call(this, { channel: frame.channel, content: pending.body });
    }
    const pending = filling.get(frame.channel);
    if (pending) {
      // A body cut short: amqplib gets what came, then this frame, and reports it as it would.
      filling.delete(frame.channel);
      if (pending.filled > 0) {
        accept.call(this, {
          channel: frame.channel,
          content: pending.body.subarray(0, pending.filled),
        });
      }
    }
    if (
      frame.id === BASIC_PROPERTIES &&
      typeof frame.size === 'number' &&
      Number.isSafeInteger(frame.size) &&
      frame.size >= IN_PLACE_MIN_BYTES &&
      frame.size <= IN_PLACE_MAX_BYTES
    ) {
      filling.set(frame.channel, { body: pool.take(frame.size), filled: 0 });
    }
    return accept.call(this, frame);
  };
  assembled.add(connection);
  return true;
}
