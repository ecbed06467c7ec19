import { randomUUID } from 'node:crypto';
import { eventually } from '../../../testing/conformance/transport.conformance';
import type { InboundMessage } from '../../../ports/transport.port';
import { describeDeadLetterBoxConformance } from '../../../testing/conformance/dead-letter-box.conformance';
import { OwnedNatsServer } from '../../../../test/support/processes/owned-nats.server';
import { describeWithServer } from '../../../../test/support/servers';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { connectNats } from './nats.client';
import { deleteFoundNothing, NatsDeadLetterBox } from './nats.dead-letter-box';
import { streamName } from './nats.naming';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import { NatsTransport } from './nats.transport';

// On a server of its own (and a fresh store, removed after): the suite's streams go with it.
describeWithServer('nats', 'NatsTransport dead letters', () => {
  let server: OwnedNatsServer;

  beforeAll(async () => {
    server = await OwnedNatsServer.start();
  });

  afterAll(async () => {
    await server?.dispose();
  });

  describeDeadLetterBoxConformance('nats (JetStream)', {
    create: () =>
      NatsTransport.connect(
        { servers: server.url, reconnectTimeWait: 100 },
        { maxMessageBytes: 64 * 1024, nakDelayMs: 5 },
      ),
  });

  it('replays a dead letter once when two processes replay it at the same time', async () => {
    const connect = () => NatsTransport.connect({ servers: server.url }, { nakDelayMs: 5 });
    const [one, two] = await Promise.all([connect(), connect()]);
    try {
      const channel = `nats-dlq.${randomUUID()}`;
      const received: InboundMessage[] = [];
      await one.subscribe(channel, async (message) => {
        if (message.headers['x-replay-count'] === undefined) {
          return { action: 'dead-letter', reason: 'poison: once' };
        }
        received.push(message);
        return { action: 'ack' };
      });
      await one.publish(channel, Buffer.from('once'), {});
      let id: string | undefined;
      for (let tries = 0; id === undefined && tries < 200; tries++) {
        id = (await one.deadLetters().browse(channel, { limit: 1 })).items[0]?.id;
        if (id === undefined) await new Promise((resolve) => setTimeout(resolve, 20));
      }
      if (id === undefined) throw new Error('the message was not dead-lettered');

      const results = await Promise.all(
        [one, two].map((transport) =>
          transport.deadLetters().replay(channel, [id], { ratePerSecond: 100 }),
        ),
      );

      expect(results.flatMap((result) => result.done)).toEqual([id]);
      expect(results.flatMap((result) => result.failed)).toEqual([]);
      await one.publish(channel, Buffer.from('sentinel'), { 'x-replay-count': 0 });
      await eventually(() => received.some((m) => m.body.toString() === 'sentinel'), 'sentinel');
      expect(received.map((m) => m.body.toString())).toEqual(['once', 'sentinel']);
      expect((await two.deadLetters().browse(channel, { limit: 10 })).items).toEqual([]);
    } finally {
      await Promise.all([one.close(), two.close()]);
    }
  });

  describe('a dead-letter stream that refuses deletes (deny_delete)', () => {
    let transport: NatsTransport;
    let channel: string;
    const received: string[] = [];

    beforeEach(async () => {
      received.length = 0;
      transport = await NatsTransport.connect({ servers: server.url }, { nakDelayMs: 5 });
      channel = `nats-dlq.${randomUUID()}`;
      await transport.subscribe(channel, async (message) => {
        if (message.headers['x-replay-count'] === undefined) {
          return { action: 'dead-letter', reason: 'poison: first time' };
        }
        received.push(message.body.toString());
        return { action: 'ack' };
      });
    });

    afterEach(() => transport.close());

    /** Publishes a message the handler dead-letters; gives the dead letter's id. */
    async function deadLettered(body: string): Promise<string> {
      await transport.publish(channel, Buffer.from(body), {});
      const box = transport.deadLetters();
      let id: string | undefined;
      for (let tries = 0; id === undefined && tries < 200; tries++) {
        id = (await box.browse(channel, { limit: 1 })).items[0]?.id;
        if (id === undefined) await new Promise((resolve) => setTimeout(resolve, 20));
      }
      if (id === undefined) throw new Error('the message was not dead-lettered');
      return id;
    }

    /** Dead-letters one message, then has its dead-letter stream refuse deletes. */
    async function undeletableDeadLetter(): Promise<string> {
      const id = await deadLettered('payment-1');
      const nc = await connectNats({ servers: server.url });
      try {
        const jsm = await jetstreamManager(nc);
        const stream = await jsm.streams.find(transport.deadLetterChannel(channel));
        const { config } = await jsm.streams.info(stream);
        await jsm.streams.update(stream, { ...config, deny_delete: true });
      } finally {
        await nc.close();
      }
      return id;
    }

    const listed = async () =>
      (await transport.deadLetters().browse(channel, { limit: 10 })).items.map((item) => item.id);

    it("tells JetStream's answers to a delete apart: nothing there, or a refusal", async () => {
      const id = await undeletableDeadLetter();
      const nc = await connectNats({ servers: server.url });
      try {
        const jsm = await jetstreamManager(nc);
        const stream = await jsm.streams.find(transport.deadLetterChannel(channel));
        const refused = await jsm.streams
          .deleteMessage(stream, Number(id))
          .catch((e: unknown) => e);
        // A stream that allows deletes, whose one message was deleted already.
        const open = `NSEQ_TEST_${randomUUID().slice(0, 8)}`;
        await jsm.streams.add({ name: open, subjects: [`${open}.x`] });
        await jetstream(nc).publish(`${open}.x`, 'x');
        await jsm.streams.deleteMessage(open, 1);
        const absent = await jsm.streams.deleteMessage(open, 1).catch((e: unknown) => e);
        await jsm.streams.delete(open);
        expect({
          refused: deleteFoundNothing(refused),
          absent: deleteFoundNothing(absent),
        }).toEqual({ refused: false, absent: true });
      } finally {
        await nc.close();
      }
    });

    it('reports a discard it could not do as failed, not missing', async () => {
      const id = await undeletableDeadLetter();
      const result = await transport.deadLetters().discard(channel, [id]);
      expect(result).toEqual({ done: [], missing: [], failed: [expect.objectContaining({ id })] });
      expect(await listed()).toEqual([id]);
    });

    it('reports a replay whose PubAck never came as uncertain, and keeps the dead letter', async () => {
      const id = await deadLettered('payment-2');
      const nc = await connectNats({ servers: server.url });
      try {
        const box = new NatsDeadLetterBox({
          jsm: () => jetstreamManager(nc),
          stream: (name) => streamName('NSEQ_', name),
          deadLetterChannel: (name) => transport.deadLetterChannel(name),
          // Stored by the server, whose PubAck is lost on the way back.
          publish: async (target, body, headers) => {
            await transport.publish(target, body, headers);
            throw new PublishTimeoutError(target, 50, true);
          },
        });
        const result = await box.replay(channel, [id], { ratePerSecond: 100 });
        expect(result).toEqual({
          done: [],
          missing: [],
          failed: [],
          uncertain: [{ id, error: expect.stringContaining('not confirmed within 50 ms') }],
        });
        expect(result.uncertain?.[0]?.error).toContain(
          'check whether it was delivered before you replay it again',
        );
      } finally {
        await nc.close();
      }
      expect(await listed()).toEqual([id]);
    });

    it('reports a replay whose dead letter could not be removed as uncertain, not done', async () => {
      const id = await undeletableDeadLetter();
      const result = await transport.deadLetters().replay(channel, [id], { ratePerSecond: 100 });
      await eventually(() => received.length === 1, 'the replayed copy delivered');
      expect(result).toEqual({
        done: [],
        missing: [],
        failed: [],
        uncertain: [{ id, error: expect.stringMatching(/^republished, but not removed: /) }],
      });
      expect(await listed()).toEqual([id]);
    });
  });
});
