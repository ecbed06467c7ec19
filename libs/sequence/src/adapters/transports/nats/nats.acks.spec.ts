import { randomUUID } from 'node:crypto';
import { AckPolicy, jetstream, jetstreamManager, type JsMsg } from '@nats-io/jetstream';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import {
  deliveryOf,
  encodeVerdict,
  epochNanos,
  forwardMsgId,
  nak,
  storedKey,
  term,
} from './nats.acks';
import { connectNats, type NatsConnection } from './nats.client';

describe('encodeVerdict', () => {
  const text = (bytes: Uint8Array) => new TextDecoder().decode(bytes);

  it('spells the verdicts as JetStream takes them, delays in nanoseconds', () => {
    expect(text(encodeVerdict({ kind: 'ack' }))).toBe('+ACK');
    expect(text(encodeVerdict({ kind: 'working' }))).toBe('+WPI');
    expect(text(encodeVerdict(nak(250)))).toBe('-NAK {"delay":250000000}');
    expect(text(encodeVerdict(term('bad-fragment: crc')))).toBe('+TERM bad-fragment: crc');
    expect(text(encodeVerdict(term('')))).toBe('+TERM');
  });
});

describe('epochNanos', () => {
  it('reads every digit of a stored time, however many the server wrote', () => {
    expect(epochNanos('2026-12-06T15:04:05.123456789Z')).toBe('1796569445123456789');
    expect(epochNanos('2026-12-06T15:04:05.1234Z')).toBe('1796569445123400000');
    expect(epochNanos('2026-12-06T15:04:05Z')).toBe('1796569445000000000');
    expect(epochNanos('2026-12-06T16:04:05.5+01:00')).toBe('1796569445500000000');
    expect(epochNanos('yesterday')).toBeUndefined();
  });
});

describeWithServer('nats', 'deliveryOf on NATS JetStream', () => {
  let connection: NatsConnection;
  const stream = `NSEQACKS_${randomUUID().slice(0, 8)}`;
  const subject = `nseq-acks.${randomUUID()}`;

  beforeAll(async () => {
    connection = await connectNats({ servers: SERVERS.nats.url });
    const jsm = await jetstreamManager(connection);
    await jsm.streams.add({ name: stream, subjects: [subject] });
    await jsm.consumers.add(stream, {
      durable_name: 'c',
      ack_policy: AckPolicy.Explicit,
      ack_wait: 30_000_000_000,
    });
  });

  afterAll(async () => {
    const jsm = await jetstreamManager(connection);
    await jsm.streams.delete(stream).catch(() => undefined);
    await connection.close();
  });

  async function next(): Promise<JsMsg> {
    const consumer = await jetstream(connection).consumers.get(stream, 'c');
    const message = await consumer.next({ expires: 5_000 });
    if (!message) throw new Error('no message');
    return message;
  }

  it("rebuilds the delivery's ack subject exactly as the server sent it", async () => {
    await jetstream(connection).publish(subject, 'a');
    const message = await next();
    const delivery = deliveryOf(message);
    // The client keeps the subject the server sent on the message it wraps.
    const sent = (message as unknown as { msg: { reply: string } }).msg.reply;
    expect(delivery.ackSubject).toBe(sent);
    expect(delivery.message).toBeUndefined();
    expect(delivery.streamSequence).toBe(message.seq);
    expect(delivery.deliveryCount).toBe(1);
    message.ack();
  });

  it('names the stored message the same on every delivery, and its forwards by it', async () => {
    await jetstream(connection).publish(subject, 'b');
    const first = await next();
    first.nak();
    const second = await next();
    second.ack();
    await jetstream(connection).publish(subject, 'c');
    const other = await next();
    other.ack();

    const [one, two, three] = [first, second, other].map(deliveryOf);
    expect(two.deliveryCount).toBe(2);
    expect(two.stored).toBe(one.stored);
    expect(one.stored).toBe(`${stream}:${first.seq}:${first.timestampNanos}`);
    // Read from the stream (as the MAX_DELIVERIES watch reads it), it has the same key.
    const read = await (
      await jetstreamManager(connection)
    ).streams.getMessage(stream, {
      seq: first.seq,
    });
    expect(storedKey(stream, read!)).toBe(one.stored);
    expect(three.stored).not.toBe(one.stored);
    expect(forwardMsgId('dead-letter', two.stored)).toBe(forwardMsgId('dead-letter', one.stored));
    expect(forwardMsgId('dead-letter', three.stored)).not.toBe(
      forwardMsgId('dead-letter', one.stored),
    );
    expect(forwardMsgId('dead-letter', one.stored)).toHaveLength(randomUUID().length);
  });

  it('settles through that subject: a nak brings the message back, an ack removes it', async () => {
    await jetstream(connection).publish(subject, 'b');
    const first = await next();
    const delivery = deliveryOf(first);
    connection.publish(delivery.ackSubject!, encodeVerdict(nak(1)));
    const again = await next();
    expect(again.seq).toBe(first.seq);
    expect(again.info.deliveryCount).toBe(2);
    connection.publish(deliveryOf(again).ackSubject!, encodeVerdict({ kind: 'ack' }));
    const jsm = await jetstreamManager(connection);
    // The server applies acks apart from answering requests: asked until it has.
    let pending = 1;
    for (let tries = 0; tries < 200 && pending > 0; tries++) {
      if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 10));
      pending = (await jsm.consumers.info(stream, 'c')).num_ack_pending;
    }
    expect(pending).toBe(0);
  });
});
