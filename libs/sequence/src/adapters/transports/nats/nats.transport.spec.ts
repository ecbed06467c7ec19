import { randomBytes, randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { Logger } from '@nestjs/common';
import {
  jetstream,
  jetstreamManager,
  JetStreamApiError,
  type JetStreamManager,
} from '@nats-io/jetstream';
import { eventually } from '../../../testing/conformance/transport.conformance';
import { OwnedNatsServer } from '../../../../test/support/processes/owned-nats.server';
import { sparePort } from '../../../../test/support/processes/server-process';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import { exposedGc } from '../../../../test/support/garbage';
import { delay } from '../../../core/async';
import { BrokerUnavailableError } from '../../../core/errors/broker-unavailable.error';
import { InvalidHeaderError } from '../../../core/errors/invalid-header.error';
import type { HeaderMap } from '../../../core/headers';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import {
  headerBytes,
  isFinalRefusal,
  isUnsendable,
  type Disposition,
  type InboundMessage,
} from '../../../ports/transport.port';
import { publishWithRetry } from '../../../kernel/publish-with-retry';
import type { ResolvedPublishPolicy } from '../../../options/resolved-options';
import { NatsDuplicateWindowError } from './errors/nats-duplicate-window.error';
import { NatsTopologyError } from './errors/nats-topology.error';
import { MAX_DELIVERIES_ADVISORY } from './nats.delivery-limit';
import { connectNats, nanos, natsHeaders, type NatsConnection } from './nats.client';
import { forwardMsgId, storedKey } from './nats.acks';
import { HEADER_OVERHEAD_BYTES, HEADER_TYPES_HEADER } from './nats.headers';
import { leaseStreamName, partitionStreamName, streamName } from './nats.naming';
import type { NatsTransportOptions } from './nats.options';
import { NatsSubscription } from './nats.subscription';
import { NatsTransport } from './nats.transport';
import { payloadsAssembledInPlace } from './nats-payload-reads';

const ACK: Disposition = { action: 'ack' };
/** Four attempts, a confirm timeout past a short duplicate window: what a pattern publishes with. */
const RETRYING_POLICY: ResolvedPublishPolicy = {
  confirmTimeoutMs: 10_000,
  inFlight: 1,
  retry: { attempts: 4, baseDelayMs: 200, maxDelayMs: 1_000 },
};

describeWithServer('nats', 'NatsTransport on NATS JetStream', () => {
  let admin: NatsConnection;
  let jsm: JetStreamManager;
  let transport: NatsTransport;
  /** Every channel a test used; their streams (and dead-letter streams) are deleted after it. */
  const channels = new Set<string>();

  beforeAll(async () => {
    admin = await connectNats({ servers: SERVERS.nats.url });
    jsm = await jetstreamManager(admin);
  });

  afterAll(async () => {
    await admin.close();
  });

  beforeEach(async () => {
    transport = await NatsTransport.connect({ servers: SERVERS.nats.url }, { nakDelayMs: 5 });
  });

  afterEach(async () => {
    await transport.close();
    for (const channel of channels) {
      for (const stream of [
        streamName('NSEQ_', channel),
        streamName('NSEQ_', `${channel}.dlq`),
        streamName('NSEQ_', `${channel}.dlq.dlq`),
        partitionStreamName('NSEQ_', channel),
        leaseStreamName('NSEQ_', channel),
      ]) {
        await jsm.streams.delete(stream).catch(() => undefined);
      }
    }
    channels.clear();
  });

  /** Closes the test's transport and connects it again with `options`. */
  async function reconnectWith(options: NatsTransportOptions): Promise<void> {
    await transport.close();
    transport = await NatsTransport.connect({ servers: SERVERS.nats.url }, options);
  }

  function newChannel(): string {
    const channel = `nats-spec.${randomUUID()}`;
    channels.add(channel);
    return channel;
  }

  async function collect(channel: string) {
    const received: InboundMessage[] = [];
    await transport.subscribe(channel, async (message) => {
      received.push(message);
      return ACK;
    });
    return received;
  }

  it('lets go of a released body while the message itself is held', async () => {
    const channel = newChannel();
    const received: InboundMessage[] = [];
    let memory: WeakRef<ArrayBufferLike> | undefined;
    await transport.subscribe(channel, async (message) => {
      // Each message held, as broker-held reassembly holds its fragments until the end.
      received.push(message);
      if (received.length === 1) {
        memory = new WeakRef(message.body.buffer);
        message.releaseBody?.();
      }
      return ACK;
    });
    await transport.publish(channel, randomBytes(300 * 1024), {});
    await eventually(() => received.length === 1, 'the large message');
    // Later messages, so that the client has moved on from the first one's batch.
    for (const text of ['a', 'b', 'c']) await transport.publish(channel, Buffer.from(text), {});
    await eventually(() => received.length === 4, 'the later messages');

    const gc = exposedGc();
    await eventually(() => {
      gc();
      return memory!.deref() === undefined;
    }, 'the released body collected');
    expect(received[0].body.length).toBe(0);
  });

  it("takes its maxMessageBytes from the server's max_payload, less room for its headers", () => {
    const maxPayload = (admin.info as { max_payload: number }).max_payload;
    expect(transport.name).toBe('nats');
    expect(transport.maxMessageBytes).toBe(maxPayload - HEADER_OVERHEAD_BYTES);
  });

  it("refuses a maxMessageBytes over the server's max_payload", async () => {
    await expect(
      NatsTransport.connect({ servers: SERVERS.nats.url }, { maxMessageBytes: 64 * 1024 * 1024 }),
    ).rejects.toThrow(/max_payload/);
  });

  it('declares a work-queue stream and a durable pull consumer per channel and dead-letter channel', async () => {
    const channel = newChannel();
    await transport.publish(channel, Buffer.from('m'), {});

    const stream = await jsm.streams.info(streamName('NSEQ_', channel));
    expect(stream.config).toMatchObject({ subjects: [channel], retention: 'workqueue' });
    const consumer = await jsm.consumers.info(stream.config.name, 'nest-sequence');
    expect(consumer.config).toMatchObject({
      ack_policy: 'explicit',
      ack_wait: 30_000 * 1_000_000,
      max_deliver: 1_000,
    });
    const dead = await jsm.consumers.info(streamName('NSEQ_', `${channel}.dlq`), 'nest-sequence');
    expect(dead.config.max_deliver).toBe(-1);
    // A dead-letter channel has no dead-letter channel of its own.
    await expect(jsm.streams.info(streamName('NSEQ_', `${channel}.dlq.dlq`))).rejects.toThrow();
  });

  it('stores the dead letter in the dead-letter stream with the original headers and x-death-reason, and terminates the original', async () => {
    const channel = newChannel();
    await transport.subscribe(channel, async () => ({
      action: 'dead-letter',
      reason: 'crc-mismatch: fragment 2\nof sequence s-1',
    }));
    await transport.publish(channel, Buffer.from('bad'), { 'x-sequence-id': 's-1', 'x-n': 2 });

    const dlq = streamName('NSEQ_', `${channel}.dlq`);
    let stored: Awaited<ReturnType<typeof jsm.streams.getMessage>> = null;
    await eventuallyAsync(async () => {
      stored = await jsm.streams.getMessage(dlq, { seq: 1 }).catch(() => null);
      return stored !== null;
    });
    const message = stored!;
    expect(Buffer.from(message.data).toString()).toBe('bad');
    const header = (name: string) => message.header.get(name);
    expect(header('x-sequence-id')).toBe('s-1');
    expect(header('x-n')).toBe('2');
    expect(header('x-death-reason')).toBe(
      JSON.stringify('crc-mismatch: fragment 2\nof sequence s-1'),
    );
    await eventuallyAsync(
      async () => (await jsm.streams.info(streamName('NSEQ_', channel))).state.messages === 0,
    );
  });

  it('gives a dead letter a Nats-Msg-Id of the stored message, so that a second one of it is stored once', async () => {
    const channel = newChannel();
    await transport.subscribe(channel, async () => ({
      action: 'dead-letter',
      reason: 'handler-failed: no',
    }));
    await transport.publish(channel, Buffer.from('bad'), {});

    const dlq = streamName('NSEQ_', `${channel}.dlq`);
    let stored: Awaited<ReturnType<typeof jsm.streams.getMessage>> = null;
    await eventuallyAsync(async () => {
      stored = await jsm.streams.getMessage(dlq, { seq: 1 }).catch(() => null);
      return stored !== null;
    });
    // Made of the stored message (see nats.acks.spec.ts), as long as a UUID.
    const msgId = stored!.header.get('Nats-Msg-Id');
    expect(msgId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    // What a delivery after a lost term would send again.
    const again = await jetstream(admin).publish(`${channel}.dlq`, Buffer.from('bad'), {
      msgID: msgId ?? '',
    });
    expect(again.duplicate).toBe(true);
    expect((await jsm.streams.info(dlq)).state.messages).toBe(1);
  });

  it('gives a copy requeued at the tail a Nats-Msg-Id of the stored message, so that a second copy is stored once', async () => {
    const channel = newChannel();
    const stream = streamName('NSEQ_', channel);
    let calls = 0;
    let original: Awaited<ReturnType<typeof jsm.streams.getMessage>> = null;
    let copy: Awaited<ReturnType<typeof jsm.streams.getMessage>> = null;
    await transport.subscribe(channel, async () => {
      calls++;
      if (calls === 1) {
        original = await jsm.streams.getMessage(stream, { seq: 1 });
        return { action: 'requeue', delayMs: 20 };
      }
      // The copy, still stored while its handler runs: the original was acked once it was.
      copy = await jsm.streams.getMessage(stream, { seq: 2 });
      return { action: 'ack' };
    });
    await transport.publish(channel, Buffer.from('later'), {});

    await eventually(() => copy !== null, 'the copy at the tail handled');
    const msgId = copy!.header.get('Nats-Msg-Id');
    // Made of the stored original (see nats.acks.spec.ts): every delivery of it gives this id.
    expect(msgId).toBe(forwardMsgId('requeue', storedKey(stream, original!)));
    // What a delivery after a lost ack of the original would requeue again.
    const again = await jetstream(admin).publish(channel, Buffer.from('later'), {
      msgID: msgId ?? '',
    });
    expect(again.duplicate).toBe(true);
    expect(calls).toBe(2);
  });

  it('dead-letters a message still requeued at its max_deliver-th delivery', async () => {
    await reconnectWith({ maxDeliver: 3, nakDelayMs: 0 });
    const channel = newChannel();
    const dead = await collect(transport.deadLetterChannel(channel));
    let deliveries = 0;
    await transport.subscribe(channel, async () => {
      deliveries++;
      return { action: 'requeue' };
    });
    await transport.publish(channel, Buffer.from('poison'), {});

    await eventually(() => dead.length === 1, 'the dead letter');
    expect(deliveries).toBe(3);
    expect(dead[0].headers['x-death-reason']).toMatch(/^max-deliver: delivered 3 times/);
  });

  it('tells its dead-letter listeners of the max-deliver dead letters it sends on its own', async () => {
    await reconnectWith({ maxDeliver: 2, nakDelayMs: 0 });
    const told: Array<[string, string]> = [];
    transport.onDeadLetter((channel, reason) => told.push([channel, reason]));
    const channel = newChannel();
    const dead = await collect(transport.deadLetterChannel(channel));
    await transport.subscribe(channel, async () => ({ action: 'requeue' }));
    await transport.subscribe(`${channel}-2`, async () => ({ action: 'dead-letter', reason: 'x' }));
    channels.add(`${channel}-2`);
    await transport.publish(channel, Buffer.from('poison'), {});
    await transport.publish(`${channel}-2`, Buffer.from('given'), {});

    await eventually(() => dead.length === 1 && told.length === 1, 'the dead letter, told');
    // A dead letter given as a disposition is counted by the module, not told here.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(told).toEqual([[channel, expect.stringMatching(/^max-deliver: delivered 2 times/)]]);
  });

  /** A consumer that crashed holding the channel's message `times` times, never settling it. */
  async function strand(channel: string, times: number): Promise<void> {
    const consumer = await jetstream(admin).consumers.get(
      streamName('NSEQ_', channel),
      'nest-sequence',
    );
    for (let delivery = 1; delivery <= times; delivery++) {
      const batch = await consumer.fetch({ max_messages: 1, expires: 3_000 });
      let got = 0;
      for await (const message of batch) got = message.info.deliveryCount;
      expect(got).toBe(delivery);
    }
  }

  it('dead-letters a message the server stopped delivering at max_deliver unsettled', async () => {
    await reconnectWith({ maxDeliver: 2, ackWaitMs: 1_000 });
    const told: Array<[string, string]> = [];
    transport.onDeadLetter((channel, reason) => told.push([channel, reason]));
    const channel = newChannel();
    await transport.publish(channel, Buffer.from('stranded'), { 'x-sequence-id': 's-7' });
    await strand(channel, 2);
    const handled: InboundMessage[] = [];
    await transport.subscribe(channel, async (message) => {
      handled.push(message);
      return ACK;
    });
    const dead = await collect(transport.deadLetterChannel(channel));

    await eventually(() => dead.length === 1, 'the dead letter', 10_000);
    expect(dead[0].body.toString()).toBe('stranded');
    expect(dead[0].headers).toMatchObject({ 'x-sequence-id': 's-7' });
    expect(String(dead[0].headers['x-death-reason'])).toMatch(
      /^max-deliver: delivered 2 times \(the consumer's max_deliver\)/,
    );
    let left = -1;
    for (let tries = 0; tries < 100 && left !== 0; tries++) {
      if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 50));
      left = (await jsm.streams.info(streamName('NSEQ_', channel))).state.messages;
    }
    expect(left).toBe(0);
    expect(handled).toEqual([]);
    expect(told).toEqual([[channel, String(dead[0].headers['x-death-reason'])]]);
  });

  it("ignores what is not the server's advisory for its consumer, and keeps its connection reading", async () => {
    const channel = newChannel();
    const stream = streamName('NSEQ_', channel);
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const handled: string[] = [];
    await transport.subscribe(channel, async (message) => {
      handled.push(message.body.toString());
      if (handled.length === 1) await released;
      return ACK;
    });
    const dead = await collect(transport.deadLetterChannel(channel));
    await transport.publish(channel, Buffer.from('held'), {});
    await eventually(() => handled.length === 1, 'the first delivery');
    const held = (await jsm.streams.info(stream)).state.first_seq;

    // Another consumer's advisories for the held message, then bodies that are not advisories.
    const subject = `${MAX_DELIVERIES_ADVISORY}.${stream}.nest-sequence`;
    const others = [
      { stream: 'OTHER', consumer: 'nest-sequence', stream_seq: held, deliveries: 1_000 },
      { stream, consumer: 'another', stream_seq: held, deliveries: 1_000 },
    ];
    for (const body of [
      ...others.map((other) => JSON.stringify(other)),
      'null',
      '[]',
      '"x"',
      '7',
    ]) {
      admin.publish(subject, body);
    }
    await admin.flush();

    await transport.publish(channel, Buffer.from('next'), {});
    await eventually(() => handled.length === 2, 'a delivery after the advisories', 5_000);
    release();
    let left = -1;
    for (let tries = 0; tries < 100 && left !== 0; tries++) {
      if (tries > 0) await delay(50);
      left = (await jsm.streams.info(stream)).state.messages;
    }
    expect(left).toBe(0);
    expect(handled).toEqual(['held', 'next']);
    expect(dead).toEqual([]);
  });

  it('stores one dead letter of a message dead-lettered at its last delivery whose term was lost', async () => {
    // The connection as if lost right after the dead letter's PubAck: the term, and the delete
    // that follows it, never reach the server, which then gives the message up unsettled at its
    // max_deliver and tells so in the advisory every subscription listens for.
    const nc = await connectNats({ servers: SERVERS.nats.url });
    const lossy = new Proxy(nc, {
      get(target, property) {
        if (property === 'publish') {
          return (subject: string, payload?: Uint8Array, ...rest: unknown[]) => {
            if (payload && Buffer.from(payload).toString().startsWith('+TERM')) return;
            (target as unknown as { publish(...args: unknown[]): void }).publish(
              subject,
              payload,
              ...rest,
            );
          };
        }
        if (property === 'request') {
          return (subject: string, ...rest: unknown[]) =>
            subject.startsWith('$JS.API.STREAM.MSG.DELETE.')
              ? Promise.reject(new Error('connection lost'))
              : (target as unknown as { request(...args: unknown[]): unknown }).request(
                  subject,
                  ...rest,
                );
        }
        const value: unknown = Reflect.get(target, property);
        return typeof value === 'function' ? (value.bind(target) as unknown) : value;
      },
    });
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    await transport.close();
    transport = new NatsTransport(lossy, { maxDeliver: 2, ackWaitMs: 1_000, nakDelayMs: 5 });
    try {
      const told: string[] = [];
      transport.onDeadLetter((_, reason) => told.push(reason));
      const channel = newChannel();
      await transport.subscribe(channel, async () => ({ action: 'requeue' }));
      await transport.publish(channel, Buffer.from('poison'), {});

      // The advisory's dead letter, published, could not be deleted from the stream either.
      await eventually(
        () => error.mock.calls.some(([text]) => /could not be deleted from stream/.test(`${text}`)),
        'the advisory acted on',
      );
      const dlq = await jsm.streams.info(streamName('NSEQ_', `${channel}.dlq`));
      expect(dlq.state.messages).toBe(1);
      expect(told).toHaveLength(1);
    } finally {
      error.mockRestore();
      await transport.close();
      await nc.close();
    }
  });

  describe('a message as large as the server takes, forwarded', () => {
    const reason = `handler-failed: ${'ValidationError: items[3].sku is not a known SKU; '.repeat(6)}`;

    beforeEach(async () => {
      await reconnectWith({ maxDeliver: 2, nakDelayMs: 5 });
    });

    /** Runs `publish`, answering `disposition`; gives the deliveries, the dead letter, what is left. */
    async function forwarded(
      disposition: Disposition,
      publish: (channel: string) => Promise<void>,
    ) {
      const channel = newChannel();
      const dead = await collect(transport.deadLetterChannel(channel));
      let deliveries = 0;
      await transport.subscribe(channel, async () => {
        deliveries++;
        return disposition;
      });
      await publish(channel);
      await eventually(() => dead.length === 1, 'the dead letter', 15_000);
      // The original is terminated and deleted once its dead letter is stored: a moment later.
      let left = -1;
      for (let tries = 0; tries < 100 && left !== 0; tries++) {
        if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 50));
        left = (await jsm.streams.info(streamName('NSEQ_', channel))).state.messages;
      }
      return { deliveries, dead: dead[0], left };
    }

    const fullSize = (headers: HeaderMap) => (channel: string) =>
      transport.publish(
        channel,
        Buffer.alloc(transport.maxMessageBytes - headerBytes(headers), 7),
        headers,
      );

    it('dead-letters one of maxMessageBytes at once, its long reason cut to fit', async () => {
      const headers = { 'x-sequence-id': 's-1', 'x-sequence-position': 1 };
      const { deliveries, dead, left } = await forwarded(
        { action: 'dead-letter', reason },
        fullSize(headers),
      );
      expect({ deliveries, left }).toEqual({ deliveries: 1, left: 0 });
      expect(dead.headers['x-sequence-id']).toBe('s-1');
      expect(reason.startsWith(String(dead.headers['x-death-reason']).slice(0, -1))).toBe(true);
      expect(String(dead.headers['x-death-reason'])).toMatch(/^handler-failed: .*…$/);
    });

    it('dead-letters one of maxMessageBytes requeued until its max_deliver-th delivery', async () => {
      const { deliveries, dead, left } = await forwarded(
        { action: 'requeue', reason },
        fullSize({ 'x-sequence-id': 's-2' }),
      );
      expect({ deliveries, left }).toEqual({ deliveries: 2, left: 0 });
      expect(String(dead.headers['x-death-reason'])).toMatch(/^max-deliver: delivered 2 times/);
    });

    /** Another program's message: `header` a large header, the body filling the rest. */
    const foreign = (channel: string, room: number) => {
      const maxPayload = (admin.info as { max_payload: number }).max_payload;
      const headers = natsHeaders();
      headers.append('x-sequence-id', 'seq-9');
      headers.append('x-foreign', 'f'.repeat(150));
      return jetstream(admin).publish(channel, Buffer.alloc(maxPayload - room, 2), {
        headers: headers as never,
      });
    };

    it("dead-letters another program's message, leaving out its largest header to fit", async () => {
      const { dead, left } = await forwarded(
        { action: 'dead-letter', reason: 'no-handler' },
        async (channel) => {
          await foreign(channel, 260);
        },
      );
      expect(left).toBe(0);
      expect(dead.headers).toMatchObject({
        'x-death-reason': 'no-handler',
        'x-sequence-id': 'seq-9',
        'x-dropped-headers': 'x-foreign',
      });
      expect(dead.headers['x-foreign']).toBeUndefined();
    });

    it('leaves a message whose dead letter cannot fit in its stream after max_deliver, reported', async () => {
      const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
      try {
        const told: string[] = [];
        transport.onDeadLetter((_channel, reason) => told.push(reason));
        const channel = newChannel();
        const dead = await collect(transport.deadLetterChannel(channel));
        let deliveries = 0;
        await transport.subscribe(channel, async () => {
          deliveries++;
          return { action: 'dead-letter', reason: 'no-handler' };
        });
        // Another program's message, its body leaving room for its own small headers only.
        const maxPayload = (admin.info as { max_payload: number }).max_payload;
        const headers = natsHeaders();
        headers.append('x-sequence-id', 'seq-9');
        headers.append('x-sequence-position', '3');
        await jetstream(admin).publish(channel, Buffer.alloc(maxPayload - 70, 2), {
          headers: headers as never,
        });
        const logged = () => error.mock.calls.map(([line]) => String(line));
        const final = (line: string) =>
          /stays in stream .* at sequence 1, never delivered again/.test(line);
        await eventually(() => logged().some(final), 'the final report', 15_000);

        // Each delivery's failure names the message, its sequence and what comes next.
        expect(deliveries).toBe(2);
        const attempts = logged().filter((line) => !final(line));
        expect(attempts).toHaveLength(2);
        for (const line of attempts) {
          expect(line).toMatch(/message 1 of .* \(sequence seq-9, position 3\) .*no-handler/);
          expect(line).toMatch(/max_deliver/);
        }
        expect(logged().find(final)).toMatch(/\(sequence seq-9, position 3\)/);
        // Left for an operator: not dead-lettered, not counted, not delivered again.
        await new Promise((resolve) => setTimeout(resolve, 1_500));
        expect({ deliveries, dead: dead.length, told }).toEqual({
          deliveries: 2,
          dead: 0,
          told: [],
        });
        const info = await jsm.streams.info(streamName('NSEQ_', channel));
        expect(info.state.messages).toBe(1);
      } finally {
        error.mockRestore();
      }
    });

    it('dead-letters one of maxMessageBytes the server stopped delivering at max_deliver', async () => {
      await reconnectWith({ maxDeliver: 2, ackWaitMs: 1_000 });
      const channel = newChannel();
      await fullSize({ 'x-sequence-id': 's-3' })(channel);
      await strand(channel, 2);
      const dead = await collect(transport.deadLetterChannel(channel));
      await transport.subscribe(channel, async () => ACK);

      await eventually(() => dead.length === 1, 'the dead letter', 10_000);
      expect(dead[0].body.length).toBe(
        transport.maxMessageBytes - headerBytes({ 'x-sequence-id': 's-3' }),
      );
      expect(String(dead[0].headers['x-death-reason'])).toMatch(/^max-deliver: delivered 2 times/);
    });

    it('never leaves a header out of a copy requeued on its own channel', async () => {
      const channel = newChannel();
      const seen: InboundMessage[] = [];
      await transport.subscribe(channel, async (message) => {
        seen.push(message);
        return seen.length === 1 ? { action: 'requeue', delayMs: 1 } : ACK;
      });
      await foreign(channel, 260);
      await eventually(() => seen.length === 2, 'delivered again');
      expect(seen[1].headers).toMatchObject({ 'x-sequence-id': 'seq-9' });
      expect(seen[1].headers['x-foreign']).toBe('f'.repeat(150));
    });
  });

  it('puts a message handed back at its max_deliver-th delivery at the tail on close', async () => {
    await reconnectWith({ maxDeliver: 2 });
    const channel = newChannel();
    await transport.publish(channel, Buffer.from('held twice'), { 'x-n': 1 });
    // Two subscribers in turn take it and close without settling it; the second also released
    // its body, which the copy reads back from the stream.
    for (const release of [false, true]) {
      let taken = false;
      const held = await transport.subscribe(channel, (message) => {
        if (release) message.releaseBody?.();
        taken = true;
        return new Promise<Disposition>(() => undefined);
      });
      await eventually(() => taken, 'taken');
      await held.close();
    }

    const received = await collect(channel);
    await eventually(() => received.length === 1, 'delivered a third time');
    expect(received[0].body.toString()).toBe('held twice');
    expect(received[0].headers['x-n']).toBe(1);
    expect(received[0].headers['x-requeue-count']).toBe(1);
  });

  it('puts a message held at its max_deliver-th delivery at the tail when the transport closes', async () => {
    await transport.close();
    const first = await NatsTransport.connect({ servers: SERVERS.nats.url }, { maxDeliver: 2 });
    const channel = newChannel();
    await first.publish(channel, Buffer.from('in flight at shutdown'), { 'x-n': 1 });
    let taken = false;
    const earlier = await first.subscribe(channel, () => {
      taken = true;
      return new Promise<Disposition>(() => undefined);
    });
    await eventually(() => taken, 'the first delivery');
    await earlier.close();
    // The second delivery, its last, is still in its handler when the application shuts down.
    taken = false;
    await first.subscribe(channel, () => {
      taken = true;
      return new Promise<Disposition>(() => undefined);
    });
    await eventually(() => taken, 'the second delivery');
    await first.close();

    transport = await NatsTransport.connect({ servers: SERVERS.nats.url });
    const received = await collect(channel);
    await eventually(() => received.length === 1, 'delivered by the next instance');
    expect(received[0].body.toString()).toBe('in flight at shutdown');
    expect(received[0].headers['x-requeue-count']).toBe(1);
  });

  it('hands back a message the server sent as the subscription closed, not leaving it for ack_wait', async () => {
    // A message in flight to the pull inbox as close() stops the pull must be naked too, not
    // dropped by the client (the server would count it delivered until ack_wait). A race: rounds.
    const js = jetstream(admin);
    for (let round = 0; round < 4; round++) {
      await reconnectWith({ ackWaitMs: 10_000 });
      const channel = newChannel();
      let handled = 0;
      await transport.subscribe(channel, () => {
        handled++;
        return new Promise<Disposition>(() => undefined); // held until close
      });
      let publishing = true;
      const publisher = (async () => {
        while (publishing) await js.publish(channel, Buffer.alloc(1000)).catch(() => undefined);
      })();
      await eventually(() => handled >= 3, 'the first deliveries');
      await transport.close();
      publishing = false;
      await publisher;

      await reconnectWith({ ackWaitMs: 10_000 });
      await transport.subscribe(channel, async () => ACK);
      const stream = streamName('NSEQ_', channel);
      const started = Date.now();
      await eventuallyAsync(async () => {
        const info = await jsm.consumers.info(stream, 'nest-sequence');
        return info.num_pending === 0 && info.num_ack_pending === 0;
      }, 15_000);
      expect(Date.now() - started).toBeLessThan(3_000); // not ack_wait (10 s)
    }
  }, 60_000);

  it('delivers messages other programs publish, their headers as strings', async () => {
    const channel = newChannel();
    const received = await collect(channel);
    const headers = natsHeaders();
    headers.append('x-sequence-position', '7');
    await jetstream(admin).publish(channel, Buffer.from('plain'), {
      headers: headers as never,
    });

    await eventually(() => received.length === 1, 'the message');
    expect(received[0].headers).toEqual({ 'x-sequence-position': '7' });
  });

  describe("another program's message with headers this transport cannot take as they are", () => {
    /** Publishes with NATS's wire protocol, as a client sending header names the JS client refuses. */
    async function publishRaw(subject: string, headerLines: string, body: string): Promise<void> {
      const { hostname, port } = new URL(SERVERS.nats.url);
      const socket = connect(Number(port), hostname);
      const block = `NATS/1.0\r\n${headerLines}\r\n\r\n`;
      const total = Buffer.byteLength(block) + Buffer.byteLength(body);
      try {
        await new Promise<void>((resolve, reject) => {
          let seen = '';
          socket.on('error', reject);
          socket.on('data', (chunk: Buffer) => {
            seen += chunk.toString();
            if (seen.includes('-ERR')) reject(new Error(seen));
            if (seen.includes('PONG')) resolve();
          });
          socket.write(
            `CONNECT {"verbose":false,"pedantic":false,"headers":true,"protocol":1}\r\n` +
              `HPUB ${subject} ${Buffer.byteLength(block)} ${total}\r\n${block}${body}\r\nPING\r\n`,
          );
        });
      } finally {
        socket.destroy();
      }
    }

    it('dead-letters one whose header names the client cannot read, delivering the others', async () => {
      const channel = newChannel();
      const received = await collect(channel);
      const dead = await collect(transport.deadLetterChannel(channel));
      await transport.publish(channel, Buffer.from('before'), {});
      await publishRaw(channel, 'Bad Name: x', 'poison');
      await transport.publish(channel, Buffer.from('after'), {});

      await eventually(() => dead.length === 1 && received.length === 2, 'all three', 10_000);
      expect(received.map((message) => message.body.toString())).toEqual(['before', 'after']);
      expect(dead[0].body.toString()).toBe('poison');
      expect(String(dead[0].headers['x-death-reason'])).toMatch(
        /^malformed-header: its NATS headers cannot be read \(/,
      );
    });

    it('lists a dead letter whose headers the client cannot read, with a reason that says so', async () => {
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares both streams'), {});
      await publishRaw(transport.deadLetterChannel(channel), 'Bad Name: x', 'unreadable');

      let page = await transport.deadLetters().browse(channel, { limit: 10 });
      for (let tries = 0; tries < 50 && page.items.length === 0; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 50));
        page = await transport.deadLetters().browse(channel, { limit: 10 });
      }
      expect(page.items).toHaveLength(1);
      expect(page.items[0]).toMatchObject({ headers: {}, bytes: 'unreadable'.length });
      expect(page.items[0].reason).toMatch(/^malformed-header: its NATS headers cannot be read/);
    });

    it('hands one in a dead-letter channel to its subscriber, not to a dead-letter channel behind it', async () => {
      const channel = newChannel();
      const dlq = transport.deadLetterChannel(channel);
      await transport.publish(channel, Buffer.from('declares both streams'), {});
      await publishRaw(dlq, 'Bad Name: x', 'unreadable');
      const dead = await collect(dlq);

      await eventually(() => dead.length === 1, 'the dead letter', 10_000);
      expect(dead[0].body.toString()).toBe('unreadable');
      expect(dead[0].headers).toEqual({
        'x-death-reason': expect.stringMatching(
          /^malformed-header: its NATS headers cannot be read \(/,
        ),
      });
      // The end of the line: nothing declared behind it, the dead letter acked from its stream.
      await expect(jsm.streams.info(streamName('NSEQ_', `${dlq}.dlq`))).rejects.toThrow();
      await eventuallyAsync(
        async () => (await jsm.streams.info(streamName('NSEQ_', dlq))).state.messages === 0,
      );
    });

    it.each([
      ['dead-lettered', { action: 'dead-letter', reason: 'no-handler' }],
      ['requeued behind the others', { action: 'requeue', delayMs: 1 }],
    ] as Array<[string, Disposition]>)(
      'forwards one whose typed header cannot be checked as it is, %s',
      async (_, disposition) => {
        const channel = newChannel();
        const dead = await collect(transport.deadLetterChannel(channel));
        const seen: InboundMessage[] = [];
        await transport.subscribe(channel, async (message) => {
          seen.push(message);
          return seen.length === 1 ? disposition : { action: 'dead-letter', reason: 'no-handler' };
        });
        // A JSON header value amqplib would take for a typed field, whose type has no text form.
        const headers = natsHeaders();
        headers.append('x-meta', '{"!":{"toString":1}}');
        headers.append(HEADER_TYPES_HEADER, 'j');
        await jetstream(admin).publish(channel, Buffer.from('odd'), { headers: headers as never });

        await eventually(() => dead.length === 1, 'the dead letter', 10_000);
        expect(dead[0].body.toString()).toBe('odd');
        expect(dead[0].headers['x-death-reason']).toBe('no-handler');
      },
    );
  });

  it('refuses header names NATS cannot carry or that steer the server, sending nothing', async () => {
    const channel = newChannel();
    for (const name of ['Nats-Expected-Stream', 'with space', 'a:b']) {
      await expect(
        transport.publish(channel, Buffer.from('m'), { [name]: 'x' }),
      ).rejects.toBeInstanceOf(InvalidHeaderError);
    }
  });

  it('refuses a channel that is not a literal subject with NatsTopologyError', async () => {
    await expect(transport.publish('orders.*', Buffer.from('m'), {})).rejects.toBeInstanceOf(
      NatsTopologyError,
    );
  });

  it('refuses a channel too long for the server, keeping its connection', async () => {
    // nats-server drops the connection of a publish whose subject passes its control line; the
    // transport refuses it first, and a dead-letter subject 4 bytes longer would pass it too.
    const long = `${newChannel()}.${'x'.repeat(4_100)}`;
    await expect(transport.publish(long, Buffer.from('m'), {})).rejects.toBeInstanceOf(
      NatsTopologyError,
    );
    await expect(transport.subscribe(long, async () => ({ action: 'ack' }))).rejects.toBeInstanceOf(
      NatsTopologyError,
    );
    const channel = newChannel();
    await transport.publish(channel, Buffer.from('still connected'), {}, { timeoutMs: 2_000 });
  });

  describe('a consumer made by hand under its durable name, which it cannot use', () => {
    /** A stream of the channel made by hand (limits retention, as `nats stream add` makes). */
    async function handMade(channel: string, consumer: Record<string, unknown>): Promise<void> {
      const stream = streamName('NSEQ_', channel);
      await jsm.streams.add({ name: stream, subjects: [channel, `${channel}.other`] });
      await jsm.consumers.add(stream, { durable_name: 'nest-sequence', ...consumer });
    }

    it.each([
      [
        'a push consumer',
        () => ({ ack_policy: 'explicit', deliver_subject: `nats-spec-push.${randomUUID()}` }),
        /push consumer/,
      ],
      ['acks none', () => ({ ack_policy: 'none' }), /ack_policy none/],
      ['acks all up to each ack', () => ({ ack_policy: 'all' }), /ack_policy all/],
      [
        'filtered on another subject',
        (channel: string) => ({ ack_policy: 'explicit', filter_subject: `${channel}.other` }),
        /filter/,
      ],
    ])('refuses one that is %s with NatsTopologyError, naming it', async (_, consumer, why) => {
      const channel = newChannel();
      await handMade(channel, consumer(channel));

      const subscribing = transport.subscribe(channel, async () => ACK);
      await expect(subscribing).rejects.toBeInstanceOf(NatsTopologyError);
      await expect(subscribing).rejects.toThrow(why);
      await expect(subscribing).rejects.toThrow(/nest-sequence/);
      await expect(transport.publish(channel, Buffer.from('m'), {})).rejects.toBeInstanceOf(
        NatsTopologyError,
      );
    });

    it('takes one filtered on the channel itself', async () => {
      const channel = newChannel();
      await handMade(channel, { ack_policy: 'explicit', filter_subject: channel });
      const received = await collect(channel);
      await transport.publish(channel, Buffer.from('m'), {});
      await eventually(() => received.length === 1, 'the message');
    });
  });

  it('rejects a publish the stream refuses (full) with PublishRejectedError', async () => {
    const channel = newChannel();
    await jsm.streams.add({
      name: streamName('NSEQ_', channel),
      subjects: [channel],
      max_msgs: 1,
      discard: 'new',
    } as never);
    await transport.publish(channel, Buffer.from('first'), {});

    await expect(transport.publish(channel, Buffer.from('second'), {})).rejects.toBeInstanceOf(
      PublishRejectedError,
    );
  });

  describe("a stream's duplicate window shorter than a publish's retries", () => {
    /** Makes the stream of `channel` by hand, with a duplicate window of `windowMs`. */
    async function handMadeStream(channel: string, windowMs: number): Promise<string> {
      const stream = streamName('NSEQ_', channel);
      await jsm.streams.add({
        name: stream,
        subjects: [channel],
        duplicate_window: nanos(windowMs),
      });
      return stream;
    }

    it("refuses a publish whose timeoutMs reaches an existing stream's window, sending nothing", async () => {
      const channel = newChannel();
      const stream = await handMadeStream(channel, 1_000);

      // The default publishTimeoutMs, 10 s: a resend after 1 s could be stored twice.
      const publishing = transport.publish(channel, Buffer.from('m'), {});
      await expect(publishing).rejects.toBeInstanceOf(NatsDuplicateWindowError);
      await expect(publishing).rejects.toMatchObject({
        code: 'duplicate-window-too-short',
        channel,
        stream,
        timeoutMs: 10_000,
        duplicateWindowMs: 1_000,
      });
      expect((await jsm.streams.info(stream)).state.messages).toBe(0);
    });

    it('takes a publish within the window, or one that is never sent again', async () => {
      const channel = newChannel();
      const stream = await handMadeStream(channel, 1_000);

      await transport.publish(channel, Buffer.from('within'), {}, { timeoutMs: 900 });
      await transport.publish(channel, Buffer.from('once'), {}, { resend: false });
      expect((await jsm.streams.info(stream)).state.messages).toBe(2);
    });

    it('refuses a publish whose own timeoutMs passes the window of the stream it declared', async () => {
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares'), {});
      // What the module checks publish.confirmTimeoutMs against at bootstrap.
      expect(transport.maxPublishTimeoutMs).toBe(119_999);
      await transport.publish(channel, Buffer.from('at the limit'), {}, { timeoutMs: 119_999 });

      await expect(
        transport.publish(channel, Buffer.from('m'), {}, { timeoutMs: 120_000 }),
      ).rejects.toMatchObject({ name: 'NatsDuplicateWindowError', duplicateWindowMs: 120_000 });
      await expect(
        transport.publish(
          channel,
          Buffer.from('m'),
          {},
          { partition: { index: 0, count: 1 }, timeoutMs: 150_000 },
        ),
      ).rejects.toBeInstanceOf(NatsDuplicateWindowError);
    });

    it("moves a message given up at max_deliver with no retry past its dead-letter stream's window", async () => {
      // Every PubAck of a dead letter lost after the server stored it: each try of the watch
      // that moves the message times out, its dead letter perhaps stored.
      const nc = await connectNats({ servers: SERVERS.nats.url });
      let deadLetterSubject = '';
      const lossy = new Proxy(nc, {
        get(target, property) {
          if (property === 'request') {
            return (subject: string, ...rest: unknown[]) => {
              const answer = (
                target as unknown as { request(...args: unknown[]): Promise<unknown> }
              ).request(subject, ...rest);
              if (subject !== deadLetterSubject) return answer;
              return answer.then(() => Promise.reject(new Error('the PubAck was lost')));
            };
          }
          const value: unknown = Reflect.get(target, property);
          return typeof value === 'function' ? (value.bind(target) as unknown) : value;
        },
      });
      const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
      await transport.close();
      // duplicateWindowMs stays 120 s: the dead-letter stream, made by hand, keeps 1 s.
      transport = new NatsTransport(lossy, { maxDeliver: 2, ackWaitMs: 1_000 });
      try {
        const channel = newChannel();
        deadLetterSubject = `${channel}.dlq`;
        const deadLetters = await handMadeStream(deadLetterSubject, 1_000);
        await transport.publish(channel, Buffer.from('stranded'), {});
        await strand(channel, 2);
        await transport.subscribe(channel, async () => ACK);

        const left = () =>
          error.mock.calls
            .map(([line]) => String(line))
            .find((line) => /reached its max_deliver and could not be dead-lettered/.test(line));
        await eventually(() => left() !== undefined, 'the message left', 20_000);
        // One try stored it (its PubAck lost); none was sent after the window to store it again.
        expect((await jsm.streams.info(deadLetters)).state.messages).toBe(1);
        expect(left()).toMatch(/duplicate window \(1000 ms\)/);
      } finally {
        error.mockRestore();
        await transport.close();
        await nc.close();
      }
    }, 30_000);

    it('fails a publish with retries at once: a final refusal, not an unsendable message', async () => {
      const channel = newChannel();
      const stream = await handMadeStream(channel, 1_000);

      const outcome = await publishWithRetry(
        transport,
        channel,
        Buffer.from('m'),
        {},
        RETRYING_POLICY,
      );

      expect(outcome).toMatchObject({ ok: false, attempts: 1, maybeDelivered: false });
      const { error } = outcome as { error: unknown };
      expect(error).toBeInstanceOf(NatsDuplicateWindowError);
      expect(isFinalRefusal(error)).toBe(true);
      // A resequencer or an outbox would dead-letter an unsendable message: this one is fine.
      expect(isUnsendable(error)).toBe(false);
      expect((await jsm.streams.info(stream)).state.messages).toBe(0);
    });

    it('still dead-letters into a dead-letter stream of a shorter window', async () => {
      const channel = newChannel();
      const deadLetters = await handMadeStream(`${channel}.dlq`, 1_000);
      await transport.subscribe(channel, async () => ({ action: 'dead-letter', reason: 'bad' }));
      await transport.publish(channel, Buffer.from('m'), {}, { timeoutMs: 900 });

      let stored = 0;
      for (let tries = 0; tries < 100 && stored === 0; tries++) {
        await delay(50);
        stored = (await jsm.streams.info(deadLetters)).state.messages;
      }
      expect(stored).toBe(1);
    });
  });

  describe('a channel whose stream cannot be declared', () => {
    it('fails a publish with retries at once when a stream of its name takes other subjects', async () => {
      const channel = newChannel();
      const stream = streamName('NSEQ_', channel);
      await jsm.streams.add({ name: stream, subjects: [`${channel}.other`] });

      const outcome = await publishWithRetry(
        transport,
        channel,
        Buffer.from('m'),
        {},
        RETRYING_POLICY,
      );

      expect(outcome).toMatchObject({ ok: false, attempts: 1, maybeDelivered: false });
      const { error } = outcome as { error: unknown };
      expect(error).toBeInstanceOf(NatsTopologyError);
      expect(isFinalRefusal(error)).toBe(true);
      expect(isUnsendable(error)).toBe(false);
    });

    it('fails a publish with retries at once to a channel that cannot be a subject', async () => {
      const outcome = await publishWithRetry(
        transport,
        'nats-spec.*',
        Buffer.from('m'),
        {},
        RETRYING_POLICY,
      );

      expect(outcome).toMatchObject({ ok: false, attempts: 1 });
      expect((outcome as { error: unknown }).error).toBeInstanceOf(NatsTopologyError);
    });
  });

  it("keeps a long handler's message from redelivery with in-progress acks", async () => {
    await reconnectWith({ ackWaitMs: 600 });
    const channel = newChannel();
    const deliveries: InboundMessage[] = [];
    await transport.subscribe(channel, async (message) => {
      deliveries.push(message);
      // Two and a half ack_waits: kept only by in-progress acks sent one after another.
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      return ACK;
    });
    await transport.publish(channel, Buffer.from('slow'), {});

    await eventually(() => deliveries.length === 1, 'the delivery');
    await new Promise((resolve) => setTimeout(resolve, 1_900));
    expect(deliveries).toHaveLength(1);
  }, 15_000);

  describe('reply channels', () => {
    afterEach(() => jest.restoreAllMocks());

    it('reads a subject of one interest-retention reply stream through a consumer of its own', async () => {
      const replies = await transport.openReplyChannel(async () => ACK);
      expect(replies.channel).toMatch(/^nseq-reply\.[0-9a-f-]{36}$/);

      const stream = await jsm.streams.info('NSEQ__REPLY');
      expect(stream.config).toMatchObject({
        subjects: ['nseq-reply.>'],
        retention: 'interest',
        discard: 'old',
        max_age: 3_600_000 * 1_000_000,
        max_bytes: 256 * 1024 * 1024,
      });
      const consumers = await jsm.consumers.list('NSEQ__REPLY').next();
      const own = consumers.filter((info) => info.config.filter_subject === replies.channel);
      expect(own).toHaveLength(1);
      // Removed by the server when nobody pulls: what is left of a process that ended.
      expect(own[0].config).toMatchObject({ ack_policy: 'explicit', inactive_threshold: 60e9 });
      expect(own[0].config.durable_name).toBeUndefined();

      await replies.close();
      await expect(jsm.consumers.info('NSEQ__REPLY', own[0].name)).rejects.toThrow(/not found/);
    });

    /** The reply stream's last message on `channel`, or null when it holds none. */
    const storedReply = (channel: string) =>
      jsm.streams.getMessage('NSEQ__REPLY', { last_by_subj: channel });

    it('keeps an unsettled reply in the reply stream, and nothing of one to a closed channel', async () => {
      const held: Array<(disposition: Disposition) => void> = [];
      const open = await transport.openReplyChannel(
        () => new Promise<Disposition>((resolve) => held.push(resolve)),
      );
      await transport.publish(open.channel, Buffer.from('in hand'), {});
      await eventually(() => held.length === 1, 'the reply');
      expect((await storedReply(open.channel))?.string()).toBe('in hand');
      held[0](ACK);
      await open.close();

      const closed = await transport.openReplyChannel(async () => ACK);
      await closed.close();
      await transport.publish(closed.channel, Buffer.from('too late'), {});
      expect(await storedReply(closed.channel)).toBeNull();
    });

    it('acks and drops a dead-lettered reply, logging the reason', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const replies = await transport.openReplyChannel(async () => ({
        action: 'dead-letter',
        reason: 'unreadable reply',
      }));
      await transport.publish(replies.channel, Buffer.from('x'), {});

      await eventually(
        () => warn.mock.calls.some(([line]) => String(line).includes('unreadable reply')),
        'the warning',
      );
      expect(warn).toHaveBeenCalledWith(expect.stringContaining(replies.channel));
      // Logged just before the ack goes out: the stream lets go of the reply soon after.
      let stored = await storedReply(replies.channel);
      for (let polls = 0; stored !== null && polls < 200; polls++) {
        await new Promise((resolve) => setTimeout(resolve, 10));
        stored = await storedReply(replies.channel);
      }
      expect(stored).toBeNull();
      await replies.close();
    });

    it('refuses to subscribe to a reply subject as to a channel', async () => {
      await expect(transport.subscribe('nseq-reply.x', async () => ACK)).rejects.toBeInstanceOf(
        NatsTopologyError,
      );
    });
  });

  it('with unsafeSocketTricks, has the connection gather large payloads in place, after a reconnect too', async () => {
    const nc = await connectNats({ servers: SERVERS.nats.url });
    const subject = `nseq-test.in-place.${randomUUID()}`;
    const received: Uint8Array[] = [];
    try {
      await new NatsTransport(nc).close();
      expect(payloadsAssembledInPlace(nc)).toBe(false);
      const transport = new NatsTransport(nc, { unsafeSocketTricks: true });
      expect(payloadsAssembledInPlace(nc)).toBe(true);
      await (nc as unknown as { reconnect(): Promise<void> }).reconnect();
      nc.subscribe(subject, {
        callback: (_error, message) => received.push((message as { data: Uint8Array }).data),
      });
      // Flushed once the connection is back (a flush while it reconnects is refused).
      for (let tries = 1; ; tries++) {
        const flushed = await nc.flush().then(
          () => true,
          (error: unknown) => {
            if (tries === 50) throw error;
            return false;
          },
        );
        if (flushed) break;
        await delay(100);
      }
      const payload = Buffer.alloc(600 * 1024, 7);
      admin.publish(subject, payload);
      await eventually(() => received.length === 1, 'the payload arrived');
      const [data] = received;
      expect(Buffer.from(data).equals(payload)).toBe(true);
      // Gathered in one buffer of its own size: the client's own would have doubled past it.
      expect(data.byteOffset).toBe(0);
      expect(data.buffer.byteLength).toBe(payload.length);
      await transport.close();
    } finally {
      await nc.close();
    }
  });

  it('stops watching a connection the application keeps once it is closed', async () => {
    const nc = await connectNats({ servers: SERVERS.nats.url });
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const lost = () =>
      warn.mock.calls.filter(([message]) => String(message).includes('NATS connection lost'));
    try {
      await new NatsTransport(nc).close();
      await new NatsTransport(nc).close();
      const live = new NatsTransport(nc);
      await (nc as unknown as { reconnect(): Promise<void> }).reconnect();
      await eventually(() => lost().length > 0, 'the live transport saw the reconnect');
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(lost()).toHaveLength(1);
      await live.close();
    } finally {
      warn.mockRestore();
      await nc.close();
    }
  });

  describe('closed while a subscribe or a reply channel is still being declared', () => {
    /** The subscriptions a transport holds open: none may outlive its close. */
    const open = (of: NatsTransport) =>
      (of as unknown as { subscriptions: Set<unknown> }).subscriptions;

    it.each(['plain', 'reply'] as const)(
      'a %s subscribe whose declaration answers as close() starts is closed by it or starts nothing',
      async (kind) => {
        const channel = newChannel();
        await transport.publish(channel, Buffer.from('declares it'), {});
        // Every microtask offset between the declaration's answer and close(): whichever the
        // subscribe's last look at `closed` falls on, nothing outlives the close.
        for (let ticks = 0; ticks <= 8; ticks++) {
          const nc = await connectNats({ servers: SERVERS.nats.url });
          const closing = new NatsTransport(nc);
          const topology = (
            closing as unknown as {
              topology: { ensure(c: string): Promise<void>; ensureReplyConsumer(): Promise<void> };
            }
          ).topology;
          jest.spyOn(topology, 'ensure').mockResolvedValue(undefined);
          jest.spyOn(topology, 'ensureReplyConsumer').mockResolvedValue(undefined);
          const subscribing = (
            kind === 'reply'
              ? closing.openReplyChannel(async () => ACK)
              : closing.subscribe(channel, async () => ACK)
          ).then(
            () => 'resolved',
            (error: Error) => error.message,
          );
          for (let tick = 0; tick < ticks; tick++) await Promise.resolve();
          await closing.close();
          const outcome = await subscribing;
          expect({ ticks, outcome, running: open(closing).size }).toEqual({
            ticks,
            outcome: expect.stringMatching(/^(resolved|nats transport is closed: cannot )/),
            running: 0,
          });
          await nc.close();
        }
      },
      60_000,
    );

    it.each([
      ['a subscribe', 'plain'],
      ['a partitioned subscribe', 'partitioned'],
      ['openReplyChannel', 'reply'],
    ] as const)(
      '%s racing close() on a connection the application keeps rejects and starts nothing',
      async (_label, kind) => {
        const nc = await connectNats({ servers: SERVERS.nats.url });
        const closing = new NatsTransport(nc, { partitionLeaseMs: 1_000 });
        const channel = newChannel();
        const seen: string[] = [];
        const handler = async (message: InboundMessage) => {
          seen.push(message.body.toString());
          return ACK;
        };
        const started = jest.spyOn(NatsSubscription.prototype, 'start');
        try {
          const subscribing =
            kind === 'reply'
              ? closing.openReplyChannel(handler)
              : closing.subscribe(
                  channel,
                  handler,
                  kind === 'partitioned' ? { partitions: 1 } : {},
                );
          // Settled as it comes (during close), not left unhandled until close resolves.
          const outcome = subscribing.then(
            () => 'resolved',
            (error: Error) => error.message,
          );
          await closing.close();
          expect(await outcome).toMatch(/^nats transport is closed: cannot /);
          expect(started).not.toHaveBeenCalled();
          started.mockRestore();
          if (kind === 'reply') return;

          // A subscriber left running would take what is published now, and a partition lease
          // left held would keep the live subscriber from the partition.
          const seenByLive: string[] = [];
          if (kind === 'partitioned') {
            await transport.subscribe(
              channel,
              async (message) => (seenByLive.push(message.body.toString()), ACK),
              { partitions: 1 },
            );
          }
          await transport.publish(
            channel,
            Buffer.from('after close'),
            {},
            kind === 'partitioned' ? { partition: { index: 0, count: 1 } } : {},
          );
          if (kind === 'partitioned') {
            await eventually(() => seenByLive.length === 1, 'the live subscriber', 10_000);
          } else {
            await delay(2_000);
            const stream = await jsm.streams.info(streamName('NSEQ_', channel));
            expect(stream.state.messages).toBe(1);
          }
          expect({ open: open(closing).size, seen }).toEqual({ open: 0, seen: [] });
        } finally {
          started.mockRestore();
          for (const each of open(closing)) await (each as { close(): Promise<void> }).close();
          await nc.close();
        }
      },
      30_000,
    );

    it('rejects a subscribe racing close() on a connection of its own, leaving nothing open', async () => {
      const own = await NatsTransport.connect({ servers: SERVERS.nats.url });
      const channel = newChannel();
      const outcome = own
        .subscribe(channel, async () => ACK)
        .then(
          () => 'resolved',
          (error: Error) => error.message,
        );
      await own.close();
      expect(await outcome).toMatch(/^nats transport is closed: cannot subscribe to /);
      expect(open(own).size).toBe(0);
    });
  });

  it('says so when the server refuses it the MAX_DELIVERIES advisories', async () => {
    // A user that may not subscribe to advisories: nothing the server gives up is moved then.
    const server = await OwnedNatsServer.start({
      configLines: [
        'authorization { users = [ { user: app, password: app, permissions: ' +
          '{ subscribe: { deny: ["$JS.EVENT.ADVISORY.>"] } } } ] }',
      ],
    });
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const own = await NatsTransport.connect({ servers: server.url, user: 'app', pass: 'app' });
    try {
      const channel = `advisories.${randomUUID()}`;
      await own.subscribe(channel, async () => ACK);
      await eventually(
        () => errors.mock.calls.some(([text]) => String(text).includes('cannot hear')),
        'the refusal logged',
      );
      const said = errors.mock.calls
        .map(([text]) => String(text))
        .filter((text) => text.includes('cannot hear'));
      expect(said).toHaveLength(1);
      expect(said[0]).toContain(channel);
      expect(said[0]).toContain('$JS.EVENT.ADVISORY.>');
    } finally {
      errors.mockRestore();
      await own.close();
      await server.dispose();
    }
  }, 30_000);

  // One cluster and one loss of its leader for the tests here: the node left alone takes 10-20 s
  // to see it has no leader, longer than anything the tests do meanwhile.
  describe('in a JetStream cluster of its own that loses its quorum', () => {
    let nodes: OwnedNatsServer[];
    /** Transports on the first node, connected while the cluster had a leader. */
    let patient: NatsTransport;
    let impatient: NatsTransport;

    /** The JetStream API's answer to a stream lookup on the first node: `ok` or its error code. */
    async function answer(): Promise<string> {
      const nc = await connectNats({ servers: nodes[0].url });
      try {
        const own = await jetstreamManager(nc, { timeout: 2_000, checkAPI: false });
        await own.streams.info('NSEQ_NONE');
        return 'ok';
      } catch (error) {
        return error instanceof JetStreamApiError ? String(error.code) : (error as Error).message;
      } finally {
        await nc.close();
      }
    }

    async function until(wanted: string): Promise<void> {
      let got = '';
      for (let tries = 0; tries < 300 && got !== wanted; tries++) {
        if (tries > 0) await delay(100);
        got = await answer();
      }
      expect(got).toBe(wanted);
    }

    /** Starts the stopped nodes again, all of them (a stream placed on one answers nothing without it). */
    async function restartStopped(): Promise<void> {
      await Promise.all(
        nodes.filter((node) => node.pid === undefined).map((node) => node.restart()),
      );
    }

    beforeAll(async () => {
      const routes = [await sparePort(), await sparePort(), await sparePort()];
      nodes = [];
      for (const [index, port] of routes.entries()) {
        nodes.push(
          await OwnedNatsServer.start({
            configLines: [
              `server_name: n${index}`,
              `cluster { name: nseq-spec, listen: 127.0.0.1:${port}, routes: [${routes
                .map((route) => `nats://127.0.0.1:${route}`)
                .join(', ')}] }`,
            ],
          }),
        );
      }
      // No stream there: answered "not found" (10059) once the cluster has a leader.
      await until('10059');
      // Patient enough for a cluster regaining its leaders on a loaded machine (over 30 s seen).
      patient = await NatsTransport.connect(
        { servers: nodes[0].url },
        { publishTimeoutMs: 60_000 },
      );
      impatient = await NatsTransport.connect(
        { servers: nodes[0].url },
        { publishTimeoutMs: 1_500 },
      );
      await nodes[1].stop();
      await nodes[2].stop();
      // "JetStream system temporarily unavailable": passing, not a refusal of the stream.
      await until('10008');
    }, 60_000);

    afterAll(async () => {
      await patient?.close();
      await impatient?.close();
      for (const node of nodes ?? []) await node.dispose();
    });

    beforeEach(() => {
      jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    });

    afterEach(() => {
      jest.restoreAllMocks();
    });

    it('refuses a partitioned subscribe or a reply channel after publishTimeoutMs without a leader, naming the channel', async () => {
      const channel = `leaderless.${randomUUID()}`;
      const startedAt = Date.now();
      const subscribing = impatient.subscribe(channel, async () => ACK, { partitions: 2 });
      await expect(subscribing).rejects.toBeInstanceOf(NatsTopologyError);
      await expect(subscribing).rejects.toMatchObject({
        channel,
        message: expect.stringContaining('no leader'),
      });
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(1_500);

      const opening = impatient.openReplyChannel(async () => ACK);
      await expect(opening).rejects.toBeInstanceOf(NatsTopologyError);
      await expect(opening).rejects.toMatchObject({
        channel: expect.stringMatching(/^nseq-reply\./),
        message: expect.stringContaining('no leader'),
      });
    });

    it('subscribes (plain and partitioned), opens a reply channel and publishes while it has no leader, delivering once it has', async () => {
      const settled = (pending: Promise<unknown>, value: string) =>
        pending.then(
          () => value,
          (error: Error) => error,
        );
      const plain = `leaderless.${randomUUID()}`;
      const partitionedChannel = `leaderless.${randomUUID()}`;
      const received: string[] = [];
      const replies: string[] = [];
      const recordTo = (into: string[]) => async (message: InboundMessage) => {
        into.push(message.body.toString());
        return ACK;
      };
      const subscribed = settled(patient.subscribe(plain, recordTo(received)), 'started');
      const partitioned = settled(
        patient.subscribe(partitionedChannel, recordTo(received), { partitions: 1 }),
        'started',
      );
      let replyChannel = '';
      const opened = settled(
        patient
          .openReplyChannel(recordTo(replies))
          .then((subscription) => (replyChannel = subscription.channel)),
        'started',
      );
      const published = settled(
        patient.publish(plain, Buffer.from('no leader'), {}, { timeoutMs: 60_000 }),
        'stored',
      );
      // Still waiting, not failed at once with the cluster's answer.
      await delay(500);
      await restartStopped();

      expect(await Promise.all([subscribed, partitioned, opened, published])).toEqual([
        'started',
        'started',
        'started',
        'stored',
      ]);
      const partition = { index: 0, count: 1 };
      await patient.publish(partitionedChannel, Buffer.from('partitioned'), {}, { partition });
      await patient.publish(replyChannel, Buffer.from('reply'), {});
      await eventually(() => received.length === 2 && replies.length === 1, 'all three', 20_000);
      expect([received.sort(), replies]).toEqual([['no leader', 'partitioned'], ['reply']]);
    }, 120_000);
  });

  describe('on a server of its own, stopped and restarted', () => {
    let server: OwnedNatsServer;

    beforeEach(async () => {
      server = await OwnedNatsServer.start();
    });

    afterEach(async () => {
      await server.dispose();
    });

    it('stores a publish retried after a lost PubAck once (same Nats-Msg-Id)', async () => {
      const own = await NatsTransport.connect({ servers: server.url });
      try {
        const channel = `dedup.${randomUUID()}`;
        await own.publish(channel, Buffer.from('declares'), {});
        // Frozen: the first attempt gets no PubAck within its 2 s and is sent again; both reach
        // the stream once it thaws.
        server.pause();
        const published = own.publish(channel, Buffer.from('once'), {}, { timeoutMs: 8_000 });
        await new Promise((resolve) => setTimeout(resolve, 3_500));
        server.resume();
        await published;

        const ownAdmin = await connectNats({ servers: server.url });
        const ownJsm = await jetstreamManager(ownAdmin);
        const info = await ownJsm.streams.info(streamName('NSEQ_', channel));
        await ownAdmin.close();
        expect(info.state.messages).toBe(2);
      } finally {
        await own.close();
      }
    }, 30_000);

    it('gives a publish up at its timeout even when the wall clock stands still', async () => {
      const own = await NatsTransport.connect({ servers: server.url, reconnectTimeWait: 100 });
      const clock = jest.spyOn(Date, 'now');
      try {
        const channel = `still-clock.${randomUUID()}`;
        await own.publish(channel, Buffer.from('declares'), {});
        await server.stop();
        await delay(300); // the client notices
        // An NTP step back, or a VM's clock held while it catches up: Date.now() stands still.
        clock.mockReturnValue(Date.now());

        const outcome = await Promise.race([
          own.publish(channel, Buffer.from('lost'), {}, { timeoutMs: 1_000 }).then(
            () => 'published',
            (error: unknown) => error,
          ),
          delay(6_000).then(() => 'still resending'),
        ]);
        expect(outcome).toBeInstanceOf(PublishTimeoutError);
      } finally {
        clock.mockRestore();
        await own.close();
      }
    }, 30_000);

    describe('frozen (a network black hole)', () => {
      const warn = () => jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);

      /** What `closing` came to within `ms`: `closed`, or `still closing`. */
      async function within(closing: Promise<unknown>, ms: number): Promise<string> {
        const outcome = closing.then(() => 'closed');
        const late = delay(ms).then(() => 'still closing');
        return Promise.race([outcome, late]);
      }

      it('closes a subscription within about publishTimeoutMs', async () => {
        const warning = warn();
        const own = await NatsTransport.connect(
          { servers: server.url, reconnectTimeWait: 100 },
          { publishTimeoutMs: 1_000 },
        );
        try {
          const channel = `frozen.${randomUUID()}`;
          const subscription = await own.subscribe(channel, async () => ACK);
          server.pause();
          expect(await within(subscription.close(), 8_000)).toBe('closed');
        } finally {
          server.resume();
          await own.close();
          warning.mockRestore();
        }
      }, 30_000);

      it('closes the transport within about publishTimeoutMs', async () => {
        const warning = warn();
        const own = await NatsTransport.connect(
          { servers: server.url, reconnectTimeWait: 100 },
          { publishTimeoutMs: 1_000 },
        );
        try {
          await own.subscribe(`frozen.${randomUUID()}`, async () => ACK);
          server.pause();
          expect(await within(own.close(), 8_000)).toBe('closed');
        } finally {
          server.resume();
          warning.mockRestore();
        }
      }, 30_000);
    });

    it('subscribes and publishes while the server is down, delivering once it is back', async () => {
      const own = await NatsTransport.connect({ servers: server.url, reconnectTimeWait: 100 });
      try {
        const channel = `down.${randomUUID()}`;
        await server.stop();
        await new Promise((resolve) => setTimeout(resolve, 300)); // the client notices

        const startedAt = Date.now();
        const received: string[] = [];
        await own.subscribe(channel, async (message) => {
          received.push(message.body.toString());
          return ACK;
        });
        expect(Date.now() - startedAt).toBeLessThan(1_000);
        const published = own.publish(
          channel,
          Buffer.from('while down'),
          {},
          { timeoutMs: 20_000 },
        );
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        await server.restart();

        await published;
        await eventually(() => received.length === 1, 'the message', 20_000);
        // Not a whole publishTimeoutMs (10 s) for a declaration asked while the server was down.
        expect(Date.now() - startedAt).toBeLessThan(8_000);
        expect(received).toEqual(['while down']);
      } finally {
        await own.close();
      }
    }, 40_000);

    it('resumes its subscriptions after the server restarts, losing nothing', async () => {
      const own = await NatsTransport.connect(
        { servers: server.url, reconnectTimeWait: 100 },
        { nakDelayMs: 5 },
      );
      try {
        const channel = `restart.${randomUUID()}`;
        const received: string[] = [];
        await own.subscribe(channel, async (message) => {
          received.push(message.body.toString());
          return ACK;
        });
        await own.publish(channel, Buffer.from('before'), {});
        await eventually(() => received.length === 1, 'the first message');

        await server.stop();
        const during = own.publish(channel, Buffer.from('during'), {}, { timeoutMs: 20_000 });
        await eventuallyAsync(() =>
          own.ping().then(
            () => false,
            (error: unknown) =>
              error instanceof BrokerUnavailableError && error.reason === 'reconnecting',
          ),
        );
        await new Promise((resolve) => setTimeout(resolve, 500));
        await server.restart();
        await during;
        await own.publish(channel, Buffer.from('after'), {});

        await eventually(() => received.length === 3, 'every message', 20_000);
        expect(received).toEqual(['before', 'during', 'after']);
        await expect(own.ping()).resolves.toBeUndefined();
      } finally {
        await own.close();
      }
    }, 40_000);

    it('delivers again after a crash in which the server lost the stream sequence', async () => {
      const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
      // Two instances of one app: both find the stream behind, one repair serves.
      const own = await NatsTransport.connect(
        { servers: server.url, reconnectTimeWait: 100 },
        { nakDelayMs: 5 },
      );
      const other = await NatsTransport.connect(
        { servers: server.url, reconnectTimeWait: 100 },
        { nakDelayMs: 5 },
      );
      try {
        const channel = `regressed.${randomUUID()}`;
        const received: string[] = [];
        for (const transport of [own, other]) {
          await transport.subscribe(channel, async (message) => {
            received.push(message.body.toString());
            return ACK;
          });
        }
        for (const body of ['one', 'two', 'three']) {
          await own.publish(channel, Buffer.from(body), {});
        }
        await eventually(() => received.length === 3, 'the first messages');
        const stream = streamName('NSEQ_', channel);
        await eventuallyAsync(async () => (await streamState(stream)).messages === 0);

        // What a crash between removing a work-queue stream's last block and writing the next
        // leaves on some servers: no block at all, so the stream comes back at 0 while its
        // consumer has delivered up to 3.
        await server.stop('SIGKILL');
        server.removeMessageBlocks(stream);
        await server.restart();
        // Reconnected: the next publish declares the channel again.
        await eventuallyAsync(() =>
          own.ping().then(
            () => true,
            () => false,
          ),
        );
        await own.publish(channel, Buffer.from('after'), {});
        expect((await streamState(stream)).last_seq).toBeLessThan(3);

        await eventually(() => received.length === 4, 'the message after the crash', 20_000);
        // Settled, and not delivered again by a second repair.
        await new Promise((resolve) => setTimeout(resolve, 1_000));
        expect([...received].sort()).toEqual(['after', 'one', 'three', 'two']);
        const repairs = errors.mock.calls.filter(([message]) =>
          String(message).includes('lost its sequence'),
        );
        expect(repairs.length).toBeGreaterThanOrEqual(1);
        expect(repairs.length).toBeLessThanOrEqual(2); // at most one per instance
      } finally {
        errors.mockRestore();
        await other.close();
        await own.close();
      }
    }, 40_000);

    async function streamState(stream: string) {
      const ownAdmin = await connectNats({ servers: server.url });
      try {
        return (await (await jetstreamManager(ownAdmin)).streams.info(stream)).state;
      } finally {
        await ownAdmin.close();
      }
    }
  });
});

async function eventuallyAsync(check: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
