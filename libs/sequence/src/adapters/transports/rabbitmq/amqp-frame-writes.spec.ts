import { randomBytes, randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import * as amqplib from 'amqplib';
import { describeWithServer } from '../../../../test/support/servers';
import { amqpConnection } from '../../../../test/support/rabbitmq.fixture';
import { countSocketWrites } from '../../../../test/support/socket-writes';
import { coalesceFrameWrites, framesCoalesced } from './amqp-frame-writes';

const MESSAGES = 200;

/** Counts the writes on the socket under an amqplib connection. */
function watchWrites(model: amqplib.ChannelModel) {
  return countSocketWrites(
    (model as unknown as { connection: { stream: Socket } }).connection.stream,
  );
}

describeWithServer('rabbitmq', 'coalesceFrameWrites (amqplib at AMQP_URL)', () => {
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

  /** Runs `use` on a connection of its own, closed afterwards. */
  async function withConnection(use: (model: amqplib.ChannelModel) => Promise<void>) {
    const model = await amqpConnection();
    try {
      await use(model);
    } finally {
      await model.close();
    }
  }

  /** Publishes MESSAGES numbered messages in one turn; answers how the socket wrote them. */
  async function publishBurst(model: amqplib.ChannelModel) {
    const queue = `frame-writes.${randomUUID()}`;
    queues.push(queue);
    const channel = await model.createConfirmChannel();
    await channel.assertQueue(queue, { durable: false });
    const counts = watchWrites(model);
    for (let index = 0; index < MESSAGES; index++) {
      channel.sendToQueue(queue, Buffer.from(`message ${index}`), { headers: { index } });
    }
    await channel.waitForConfirms();
    await channel.close();
    return { queue, counts };
  }

  async function readBack(queue: string): Promise<string[]> {
    const channel = await admin.createChannel();
    const bodies: string[] = [];
    for (;;) {
      const message = await channel.get(queue, { noAck: true });
      if (!message) break;
      bodies.push(message.content.toString());
    }
    await channel.close();
    return bodies;
  }

  const expected = Array.from({ length: MESSAGES }, (_, index) => `message ${index}`);

  it('sends the frames of one pass in one write, byte-exact and in order', async () => {
    await withConnection(async (model) => {
      expect(framesCoalesced(model)).toBe(false);
      expect(coalesceFrameWrites(model)).toBe(true);
      expect(framesCoalesced(model)).toBe(true);
      const { queue, counts } = await publishBurst(model);
      // Without it, about one write per message (see the next test). Here each write carries up
      // to the socket's high-water mark (16 KiB, ~120 of these messages) before the multiplexer
      // waits for 'drain': a few writes carry them all.
      expect(counts.writes).toBeLessThan(MESSAGES / 10);
      expect(counts.chunks).toBeGreaterThanOrEqual(MESSAGES);
      expect(await readBack(queue)).toHaveLength(MESSAGES);
    });
  });

  it('leaves a connection it was not applied to writing frame by frame (the control)', async () => {
    await withConnection(async (model) => {
      const { counts } = await publishBurst(model);
      // Node merges writes queued behind a partial one, so not always exactly one per frame.
      expect(counts.writes).toBeGreaterThan(MESSAGES / 2);
    });
  });

  it('delivers what a coalesced connection published unchanged and in order', async () => {
    await withConnection(async (model) => {
      coalesceFrameWrites(model);
      const { queue } = await publishBurst(model);
      expect(await readBack(queue)).toEqual(expected);
    });
  });

  it('carries messages larger than a frame (8 MiB in 128 KiB frames) byte-exact', async () => {
    await withConnection(async (model) => {
      coalesceFrameWrites(model);
      const queue = `frame-writes.${randomUUID()}`;
      queues.push(queue);
      const channel = await model.createConfirmChannel();
      await channel.assertQueue(queue, { durable: false });
      const bodies = [randomBytes(8 * 1024 * 1024 + 3), randomBytes(100), randomBytes(300_000)];
      for (const body of bodies) channel.sendToQueue(queue, body);
      await channel.waitForConfirms();
      await channel.close();
      const reader = await admin.createChannel();
      for (const body of bodies) {
        const message = await reader.get(queue, { noAck: true });
        expect(message && message.content.equals(body)).toBe(true);
      }
      await reader.close();
    });
  });

  it('is idempotent: a second call does not wrap the flush again', async () => {
    await withConnection(async (model) => {
      coalesceFrameWrites(model);
      const mux = (model as unknown as { connection: { muxer: { _readIncoming: unknown } } })
        .connection.muxer;
      const wrapped = mux._readIncoming;
      expect(coalesceFrameWrites(model)).toBe(true);
      expect(mux._readIncoming).toBe(wrapped);
    });
  });

  it('does nothing to a connection whose shape it does not know', () => {
    expect(coalesceFrameWrites(undefined)).toBe(false);
    expect(coalesceFrameWrites({})).toBe(false);
    expect(coalesceFrameWrites({ connection: { muxer: {} } })).toBe(false);
    const out = { write: () => true };
    expect(coalesceFrameWrites({ connection: { muxer: { out, _readIncoming: () => 0 } } })).toBe(
      false,
    );
  });
});
