import { randomBytes, randomUUID } from 'node:crypto';
import * as amqplib from 'amqplib';
import { describeWithServer } from '../../../../test/support/servers';
import { amqpConnection } from '../../../../test/support/rabbitmq.fixture';
import { recycleBody } from '../body-pool';
import {
  assembleContentInPlace,
  contentAssembledInPlace,
  IN_PLACE_MIN_BYTES,
} from './amqp-content-reads';

const MiB = 1024 * 1024;

describeWithServer('rabbitmq', 'assembleContentInPlace (amqplib at AMQP_URL)', () => {
  const queues: string[] = [];
  let admin: amqplib.ChannelModel;

  beforeAll(async () => {
    admin = await amqpConnection();
  });

  afterAll(async () => {
    const channel = await admin.createChannel();
    for (const queue of queues) await channel.deleteQueue(queue);
    await admin.close();
  });

  /** A queue of this test's, holding `bodies` (published on the admin connection, untouched). */
  async function queueOf(bodies: readonly Buffer[]): Promise<string> {
    const queue = `content-reads.${randomUUID()}`;
    queues.push(queue);
    const channel = await admin.createConfirmChannel();
    await channel.assertQueue(queue, { durable: false });
    for (const body of bodies) channel.sendToQueue(queue, body);
    await channel.waitForConfirms();
    await channel.close();
    return queue;
  }

  /** Consumes `count` messages of `queue` on `channel`, acking each; `each` sees every one. */
  function consume(
    channel: amqplib.Channel,
    queue: string,
    count: number,
    each: (content: Buffer) => void = () => undefined,
  ): Promise<Buffer[]> {
    const received: Buffer[] = [];
    return new Promise((resolve, reject) => {
      channel
        .consume(queue, (message) => {
          if (!message) return reject(new Error('consumer cancelled'));
          received.push(message.content);
          each(message.content);
          channel.ack(message);
          if (received.length === count) resolve(received);
        })
        .catch(reject);
    });
  }

  async function withConnection(use: (model: amqplib.ChannelModel) => Promise<void>) {
    const model = await amqpConnection();
    try {
      expect(assembleContentInPlace(model)).toBe(true);
      await use(model);
    } finally {
      await model.close();
    }
  }

  it('delivers bodies of every size byte-exact and in order, consumed or fetched', async () => {
    const bodies = [
      Buffer.alloc(0),
      randomBytes(100),
      randomBytes(IN_PLACE_MIN_BYTES - 1),
      randomBytes(IN_PLACE_MIN_BYTES),
      randomBytes(300_000),
      randomBytes(8 * MiB + 3),
      randomBytes(MiB),
    ];
    await withConnection(async (model) => {
      expect(contentAssembledInPlace(model)).toBe(true);
      const consumed = await queueOf(bodies);
      const channel = await model.createChannel();
      const received = await consume(channel, consumed, bodies.length);
      expect(received.map((content) => content.length)).toEqual(bodies.map((b) => b.length));
      received.forEach((content, index) => expect(content.equals(bodies[index])).toBe(true));

      const fetched = await queueOf(bodies);
      for (const body of bodies) {
        const message = await channel.get(fetched, { noAck: true });
        expect(message && message.content.equals(body)).toBe(true);
      }
      await channel.close();
    });
  });

  it('keeps the bodies of channels consuming at once apart', async () => {
    const first = Array.from({ length: 6 }, () => randomBytes(2 * MiB + 11));
    const second = Array.from({ length: 6 }, () => randomBytes(MiB + 5));
    await withConnection(async (model) => {
      const [a, b] = await Promise.all([queueOf(first), queueOf(second)]);
      const channels = await Promise.all([model.createChannel(), model.createChannel()]);
      const [fromA, fromB] = await Promise.all([
        consume(channels[0], a, first.length),
        consume(channels[1], b, second.length),
      ]);
      fromA.forEach((content, index) => expect(content.equals(first[index])).toBe(true));
      fromB.forEach((content, index) => expect(content.equals(second[index])).toBe(true));
    });
  });

  it('writes the next large body into a recycled one, byte-exact', async () => {
    const bodies = Array.from({ length: 5 }, () => randomBytes(MiB));
    await withConnection(async (model) => {
      const queue = await queueOf(bodies);
      const channel = await model.createChannel();
      await channel.prefetch(1);
      const copies: Buffer[] = [];
      const backings = new Set<ArrayBufferLike>();
      await consume(channel, queue, bodies.length, (content) => {
        copies.push(Buffer.from(content));
        backings.add(content.buffer);
        expect(recycleBody(content)).toBe(true);
        expect(recycleBody(content)).toBe(false); // once only
      });
      copies.forEach((copy, index) => expect(copy.equals(bodies[index])).toBe(true));
      // One message at a time, each recycled before the next: the same buffer every time.
      expect(backings.size).toBe(1);
    });
  });

  it('is idempotent: a second call does not wrap the connection again', async () => {
    await withConnection(async (model) => {
      const connection = (model as unknown as { connection: { accept: unknown } }).connection;
      const wrapped = connection.accept;
      expect(assembleContentInPlace(model)).toBe(true);
      expect(connection.accept).toBe(wrapped);
    });
  });

  it('does nothing to a connection whose shape it does not know', () => {
    expect(assembleContentInPlace(undefined)).toBe(false);
    expect(assembleContentInPlace({})).toBe(false);
    expect(assembleContentInPlace({ connection: { accept: () => 0 } })).toBe(false);
    expect(
      assembleContentInPlace({
        connection: { accept: () => 0, recvFrame: () => false, rest: 'x', stream: {} },
      }),
    ).toBe(false);
  });
});

/** A frame as amqplib 0.10 reads it off the wire. */
function frame(type: number, channel: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(7);
  head.writeUInt8(type, 0);
  head.writeUInt16BE(channel, 1);
  head.writeUInt32BE(payload.length, 3);
  return Buffer.concat([head, payload, Buffer.from([0xce])]);
}

/**
 * A stand-in for amqplib's connection: `recvFrame` parses whole frames from `rest` (reading the
 * next chunk when it has none), and `accept` records what it is handed. Header frames decode to
 * `{ id: 60, size }` (their payload is the size), others to amqplib's shapes.
 */
function fakeConnection(chunks: Buffer[]) {
  const accepted: Array<{ channel: number; id?: number; size?: number; content?: Buffer }> = [];
  let next = 0;
  const connection = {
    rest: Buffer.alloc(0),
    recvSinceLastCheck: false,
    stream: { read: () => chunks[next++] ?? null },
    accept(f: { channel: number; id?: number; size?: number; content?: Buffer }) {
      accepted.push({ ...f, ...(f.content && { content: Buffer.from(f.content) }) });
    },
    recvFrame(this: { rest: Buffer; stream: { read(): Buffer | null } }): unknown {
      for (;;) {
        if (this.rest.length >= 7) {
          const size = this.rest.readUInt32BE(3);
          if (this.rest.length >= 8 + size) {
            const type = this.rest[0];
            const channel = this.rest.readUInt16BE(1);
            const payload = this.rest.subarray(7, 7 + size);
            if (this.rest[7 + size] !== 0xce) throw new Error('Invalid frame');
            this.rest = this.rest.subarray(8 + size);
            if (type === 2) return { channel, id: 60, size: Number(payload.readBigUInt64BE()) };
            if (type === 3) return { channel, content: payload };
            return { channel, id: payload.readUInt32BE(0) };
          }
        }
        const incoming = this.stream.read();
        if (incoming === null) return false;
        this.rest = Buffer.concat([this.rest, incoming]);
      }
    },
  };
  return { model: { connection }, connection, accepted };
}

function header(channel: number, size: number): Buffer {
  const payload = Buffer.alloc(8);
  payload.writeBigUInt64BE(BigInt(size));
  return frame(2, channel, payload);
}

/** Splits `bytes` into chunks of `size`. */
function chunked(bytes: Buffer, size: number): Buffer[] {
  const chunks: Buffer[] = [];
  for (let at = 0; at < bytes.length; at += size) chunks.push(bytes.subarray(at, at + size));
  return chunks;
}

/** Runs the connection's read loop as amqplib's does, until no frame is left. */
function drain(connection: ReturnType<typeof fakeConnection>['connection']): void {
  let f: unknown;
  while ((f = connection.recvFrame())) connection.accept(f as never);
}

describe('assembleContentInPlace (frames off the wire)', () => {
  const body = randomBytes(IN_PLACE_MIN_BYTES * 2 + 17);
  const pieces = [
    body.subarray(0, 100_000),
    body.subarray(100_000, 400_000),
    body.subarray(400_000),
  ];

  it('hands amqplib the body whole, as one frame, whatever the reads', () => {
    for (const readSize of [1, 7, 8, 4096, 65_536, 1_000_000]) {
      const wire = Buffer.concat([
        header(1, body.length),
        ...pieces.map((piece) => frame(3, 1, piece)),
        frame(1, 1, Buffer.from([0, 60, 0, 80])),
      ]);
      const { model, connection, accepted } = fakeConnection(chunked(wire, readSize));
      expect(assembleContentInPlace(model)).toBe(true);
      drain(connection);
      expect(accepted.map((f) => f.id ?? 'body')).toEqual([60, 'body', 0x3c0050]);
      expect(accepted[1].content!.equals(body)).toBe(true);
    }
  });

  it('hands amqplib what came of a body cut short by another frame, then that frame', () => {
    const wire = Buffer.concat([
      header(1, body.length),
      frame(3, 1, pieces[0]),
      frame(1, 1, Buffer.from([0, 20, 0, 40])),
    ]);
    const { model, connection, accepted } = fakeConnection(chunked(wire, 65_536));
    assembleContentInPlace(model);
    drain(connection);
    expect(accepted.map((f) => f.id ?? 'body')).toEqual([60, 'body', 0x140028]);
    expect(accepted[1].content!.equals(pieces[0])).toBe(true);
  });

  it('hands amqplib a body frame larger than announced as it came, after what came before', () => {
    const wire = Buffer.concat([
      header(1, IN_PLACE_MIN_BYTES),
      frame(3, 1, pieces[0]),
      frame(3, 1, randomBytes(IN_PLACE_MIN_BYTES)),
    ]);
    const { model, connection, accepted } = fakeConnection(chunked(wire, 65_536));
    assembleContentInPlace(model);
    drain(connection);
    expect(accepted.map((f) => f.content?.length ?? f.id)).toEqual([
      60,
      pieces[0].length,
      IN_PLACE_MIN_BYTES,
    ]);
  });

  it('refuses a body frame without its end marker, as amqplib does', () => {
    const bad = frame(3, 1, body);
    bad[bad.length - 1] = 0;
    const { model, connection } = fakeConnection(
      chunked(Buffer.concat([header(1, body.length), bad]), 65_536),
    );
    assembleContentInPlace(model);
    expect(() => drain(connection)).toThrow('Invalid frame');
  });
});
