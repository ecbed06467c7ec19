import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import { AckPolicy, jetstream, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
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
    const js = jetstream(connection);
    return new NatsSubscription({
      channel: subject,
      handler: async () => ({ action: 'ack' }),
      prefetch: 4,
      deadLetterChannel: undefined,
      maxDeliver: undefined,
      nakDelayMs: () => 5,
      ackWaitMs: 30_000,
      consumer: () => js.consumers.get(stream, 'c'),
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
    });
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
});
