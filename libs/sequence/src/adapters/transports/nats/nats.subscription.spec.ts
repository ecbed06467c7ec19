import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import { AckPolicy, jetstream, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import { delay } from '../../../core/async';
import { connectNats, nanos, type NatsConnection } from './nats.client';
import type { Disposition, MessageHandler } from '../../../ports/transport.port';
import { MAX_DELIVERIES_ADVISORY } from './nats.delivery-limit';
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

  /** A stream of its own, with a consumer `c` of the given `ack_wait` and `max_deliver`. */
  async function ownStream(
    ackWaitMs: number,
    maxDeliver?: number,
  ): Promise<{ own: string; ownSubject: string }> {
    const own = `NSEQSUB_${randomUUID().slice(0, 8)}`;
    const ownSubject = `nseq-sub.${randomUUID()}`;
    await jsm.streams.add({ name: own, subjects: [ownSubject] });
    await jsm.consumers.add(own, {
      durable_name: 'c',
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(ackWaitMs),
      ...(maxDeliver === undefined ? {} : { max_deliver: maxDeliver }),
    });
    return { own, ownSubject };
  }

  /**
   * A handler that records the body of each message it gets and answers `disposition` (never,
   * when undefined).
   */
  function recording(handled: string[], disposition: Disposition | undefined): MessageHandler {
    return async (message) => {
      handled.push(message.body.toString());
      return disposition ?? new Promise<Disposition>(() => undefined);
    };
  }

  /**
   * A subscription answering `disposition`, of consumer `c` (`ack_wait` `ackWaitMs`,
   * `max_deliver` `maxDeliver`) of a stream of its own, pulling at most `perPull` messages at a
   * time (as `pullMaxBytes` allows: @default 1), that may hold messages while
   * `state.hold`: it records the bodies it handles and the copies it publishes.
   */
  async function heldSubscription(
    disposition: Disposition | undefined,
    {
      ackWaitMs,
      maxDeliver,
      perPull = 1,
    }: { ackWaitMs: number; maxDeliver?: number; perPull?: number },
  ) {
    const { own, ownSubject } = await ownStream(ackWaitMs, maxDeliver);
    const state = { hold: true, handled: [] as string[], copies: [] as string[] };
    const subscription = new NatsSubscription({
      ...settings(own, ownSubject, 1_000),
      maxDeliver,
      ackWaitMs,
      pullMaxBytes: perPull * 1024 * 1024,
      handler: recording(state.handled, disposition),
      mayHold: () => state.hold,
      publish: async (_channel, body) => void state.copies.push(body.toString()),
      readFromStream: async (sequence) =>
        Buffer.from((await jsm.streams.getMessage(own, { seq: sequence }))!.data),
    });
    /** Resolves once the subscription's pull request waits for messages. */
    const pulling = async () => {
      for (let tries = 0; tries < 200; tries++) {
        if ((await jsm.consumers.info(own, 'c')).num_waiting > 0) return;
        await delay(10);
      }
    };
    return { own, ownSubject, subscription, state, pulling };
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
      const js = jetstream(connection);
      const held = await heldSubscription({ action: 'ack' }, { ackWaitMs: 30_000, maxDeliver: 1 });
      const { own, ownSubject, subscription: partition, state } = held;
      try {
        partition.start();
        await held.pulling();
        // Its owner closing, or its claim lapsed: the waiting pull brings a message at its only
        // allowed delivery, which a nak would end unhandled.
        state.hold = false;
        await js.publish(ownSubject, 'last delivery');
        await delay(300);
        await (stop === 'close' ? partition.close() : partition.abandon());
        const { num_ack_pending } = await jsm.consumers.info(own, 'c');
        // The copy is at the tail (for the partition's next holder), the original acked.
        expect({ ...state, num_ack_pending }).toEqual({
          hold: false,
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

  it.each(['kept unhandled', 'being handled', 'being handled, its owner closing'] as const)(
    'keeps a message at its last delivery in progress until its close hands it back: %s',
    async (how) => {
      // An ack_wait shorter than the pull request the close lets run out (a partition lease of a
      // second gives 500 ms), and a pull request of several messages, as the transport's: it
      // goes on waiting once one came.
      const held = await heldSubscription(undefined, { ackWaitMs: 500, maxDeliver: 1, perPull: 4 });
      const { own, ownSubject, subscription: partition, state } = held;
      // What the server tells when it gives a message up (the transport then dead-letters it).
      const givenUp: unknown[] = [];
      const advisories = connection.subscribe(`${MAX_DELIVERIES_ADVISORY}.${own}.c`, {
        callback: (_error, message) => givenUp.push((message as { json(): unknown }).json()),
      });
      try {
        partition.start();
        await held.pulling();
        // Kept unhandled: its owner is closing as the waiting pull brings the message.
        if (how === 'kept unhandled') state.hold = false;
        await jetstream(connection).publish(ownSubject, 'last delivery');
        await delay(50);
        // A partition's owner closing, its lease still trusted: it closes this subscription next.
        if (how === 'being handled, its owner closing') state.hold = false;
        await partition.close();
        await connection.flush();
        const { num_ack_pending } = await jsm.consumers.info(own, 'c');
        // Handed back as a copy at the tail, the original acked; never given up by the server.
        expect({ copies: state.copies, givenUp, num_ack_pending }).toEqual({
          copies: ['last delivery'],
          givenUp: [],
          num_ack_pending: 0,
        });
      } finally {
        advisories.unsubscribe();
        await partition.close();
        await jsm.streams.delete(own).catch(() => undefined);
      }
    },
    30_000,
  );

  it('leaves a delayed requeue whose delay ends once it may not hold messages to the server', async () => {
    const js = jetstream(connection);
    const held = await heldSubscription({ action: 'requeue', delayMs: 300 }, { ackWaitMs: 1_000 });
    const { own, ownSubject, subscription: partition, state } = held;
    try {
      partition.start();
      await js.publish(ownSubject, 'requeued later');
      for (let tries = 0; tries < 200 && state.handled.length === 0; tries++) await delay(10);
      expect(state.handled).toEqual(['requeued later']);

      // Its claim lapses during the delay (a partition's lease, another subscriber holding it
      // next), before its owner stops it: the delay ends meanwhile.
      state.hold = false;
      await delay(600);
      await partition.abandon();

      // No copy at the tail from here, and the original is not acked: it comes again.
      const consumer = await js.consumers.get(own, 'c');
      const again = await consumer.next({ expires: 5_000 });
      expect({
        copies: state.copies,
        again: again?.string(),
        deliveries: again?.info.deliveryCount,
      }).toEqual({
        copies: [],
        again: 'requeued later',
        deliveries: 2,
      });
      again?.ack();
    } finally {
      await partition.close();
      await jsm.streams.delete(own).catch(() => undefined);
    }
  }, 30_000);

  it('delivers again a message pulled while it may not hold messages, not keeping it in progress', async () => {
    const ackWaitMs = 1_000;
    const js = jetstream(connection);
    const held = await heldSubscription({ action: 'ack' }, { ackWaitMs });
    const { own, ownSubject, subscription: partition, state } = held;
    try {
      partition.start();
      await held.pulling();

      // Its lease not trusted for a moment (say): the waiting pull brings a message meanwhile.
      state.hold = false;
      await js.publish(ownSubject, 'pulled while not held');
      await delay(200);
      state.hold = true;
      await delay(3 * ackWaitMs);

      const { num_ack_pending, num_pending } = await jsm.consumers.info(own, 'c');
      expect({ handled: state.handled, num_ack_pending, num_pending }).toEqual({
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
