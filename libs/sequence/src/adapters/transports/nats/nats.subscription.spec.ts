import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import { AckPolicy, jetstream, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import { delay } from '../../../core/async';
import { connectNats, nanos, type NatsConnection } from './nats.client';
import { NatsSubscription } from './nats.subscription';

describeWithServer('nats', 'NatsSubscription on NATS JetStream', () => {
  let connection: NatsConnection;
  let jsm: JetStreamManager;
  const stream = `NSEQSUB_${randomUUID().slice(0, 8)}`;
  const subject = `nseq-sub.${randomUUID()}`;

  beforeAll(async () => {
    connection = await connectNats({ servers: SERVERS.nats.url });
    jsm = await jetstreamManager(connection);
    await jsm.streams.add({ name: stream, subjects: [subject] });
    await jsm.consumers.add(stream, {
      durable_name: 'c',
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(30_000),
    });
  });

  afterAll(async () => {
    await jsm.streams.delete(stream).catch(() => undefined);
    await connection.close();
  });

  /** A subscription of the consumer whose pull requests wait `pullExpiresMs` for messages. */
  function subscription(pullExpiresMs: number): NatsSubscription {
    return new NatsSubscription(settings(stream, subject, pullExpiresMs));
  }

  /** Settings of a subscription of consumer `c` of `of`, acking every message. */
  function settings(
    of: string,
    channel: string,
    pullExpiresMs: number,
  ): ConstructorParameters<typeof NatsSubscription>[0] {
    const js = jetstream(connection);
    return {
      channel,
      handler: async () => ({ action: 'ack' }),
      prefetch: 4,
      deadLetterChannel: undefined,
      maxDeliver: undefined,
      nakDelayMs: () => 5,
      ackWaitMs: 30_000,
      consumer: () => js.consumers.get(of, 'c'),
      onConsumerLost: () => undefined,
      publish: () => Promise.reject(new Error('not expected')),
      removeFromStream: () => Promise.reject(new Error('not expected')),
      readFromStream: () => Promise.reject(new Error('not expected')),
      respond: (to, payload) => connection.publish(to, payload),
      pullMaxBytes: 1024 * 1024,
      maxPayload: 1024 * 1024,
      flush: () => connection.flush(),
      pullExpiresMs,
      logger: new Logger('NatsSubscription'),
      onClosed: () => undefined,
    };
  }

  async function waitingPulls(): Promise<number> {
    return (await jsm.consumers.info(stream, 'c')).num_waiting;
  }

  it('closes without waiting for its pull request to run out, and leaves none behind', async () => {
    const idle = subscription(60_000);
    idle.start();
    let waiting = 0;
    for (let tries = 0; tries < 200 && waiting === 0; tries++) {
      if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 10));
      waiting = await waitingPulls();
    }
    expect(waiting).toBe(1);

    // The pull asks to wait a minute: a close that waits it out (or twice it) loses this race by
    // far; one that stops it wins it.
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      idle.close().then(() => 'closed'),
      new Promise((resolve) => (timer = setTimeout(() => resolve('still closing'), 15_000))),
    ]);
    clearTimeout(timer);
    expect(outcome).toBe('closed');
    expect(await waitingPulls()).toBe(0);

    // Nothing published after the close goes to the stopped pull: the next pull gets it, first.
    await jetstream(connection).publish(subject, 'after the close');
    const consumer = await jetstream(connection).consumers.get(stream, 'c');
    const next = await consumer.next({ expires: 5_000 });
    expect(next?.string()).toBe('after the close');
    expect(next?.info.deliveryCount).toBe(1);
    next?.ack();
  }, 30_000);
  it.each(['close', 'abandon'] as const)(
    'hands back as a copy a message pulled at its last delivery while it may not hold messages, at %s',
    async (stop) => {
      const own = `NSEQSUB_${randomUUID().slice(0, 8)}`;
      const ownSubject = `nseq-sub.${randomUUID()}`;
      await jsm.streams.add({ name: own, subjects: [ownSubject] });
      await jsm.consumers.add(own, {
        durable_name: 'c',
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(30_000),
        max_deliver: 1,
      });
      const js = jetstream(connection);
      const handled: string[] = [];
      const copies: string[] = [];
      let hold = true;
      const partition = new NatsSubscription({
        ...settings(own, ownSubject, 1_000),
        maxDeliver: 1,
        handler: async (message) => {
          handled.push(message.body.toString());
          return { action: 'ack' };
        },
        mayHold: () => hold,
        publish: async (_channel, body) => void copies.push(body.toString()),
        readFromStream: async (sequence) =>
          Buffer.from((await jsm.streams.getMessage(own, { seq: sequence }))!.data),
      });
      const waiting = async () => (await jsm.consumers.info(own, 'c')).num_waiting;
      try {
        partition.start();
        for (let tries = 0; tries < 200 && (await waiting()) === 0; tries++) await delay(10);
        // Its owner closing, or its claim lapsed: the waiting pull brings a message at its only
        // allowed delivery, which a nak would end unhandled.
        hold = false;
        await js.publish(ownSubject, 'last delivery');
        await delay(300);
        await (stop === 'close' ? partition.close() : partition.abandon());
        const { num_ack_pending } = await jsm.consumers.info(own, 'c');
        // The copy is at the tail (for the partition's next holder), the original acked.
        expect({ handled, copies, num_ack_pending }).toEqual({
          handled: [],
          copies: ['last delivery'],
          num_ack_pending: 0,
        });
      } finally {
        await partition.close();
        await jsm.streams.delete(own).catch(() => undefined);
      }
    },
    30_000,
  );

  it('delivers again a message pulled while it may not hold messages, not keeping it in progress', async () => {
    const own = `NSEQSUB_${randomUUID().slice(0, 8)}`;
    const ownSubject = `nseq-sub.${randomUUID()}`;
    const ackWaitMs = 1_000;
    await jsm.streams.add({ name: own, subjects: [ownSubject] });
    await jsm.consumers.add(own, {
      durable_name: 'c',
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(ackWaitMs),
    });
    const js = jetstream(connection);
    const handled: string[] = [];
    let hold = true;
    const partition = new NatsSubscription({
      ...settings(own, ownSubject, 1_000),
      handler: async (message) => {
        handled.push(message.body.toString());
        return { action: 'ack' };
      },
      ackWaitMs,
      mayHold: () => hold,
    });
    try {
      partition.start();
      const waiting = async () => (await jsm.consumers.info(own, 'c')).num_waiting;
      for (let tries = 0; tries < 200 && (await waiting()) === 0; tries++) await delay(10);

      // Its lease not trusted for a moment (say): the waiting pull brings a message meanwhile.
      hold = false;
      await js.publish(ownSubject, 'pulled while not held');
      await delay(200);
      hold = true;
      await delay(3 * ackWaitMs);

      const { num_ack_pending, num_pending } = await jsm.consumers.info(own, 'c');
      expect({ handled, num_ack_pending, num_pending }).toEqual({
        handled: ['pulled while not held'],
        num_ack_pending: 0,
        num_pending: 0,
      });
    } finally {
      await partition.close();
      await jsm.streams.delete(own).catch(() => undefined);
    }
  }, 30_000);
});
