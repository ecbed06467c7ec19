import { randomUUID } from 'node:crypto';
import { eventually } from '../../../testing/conformance/transport.conformance';
import type { InboundMessage } from '../../../ports/transport.port';
import { describeDeadLetterBoxConformance } from '../../../testing/conformance/dead-letter-box.conformance';
import { OwnedNatsServer } from '../../../../test/support/processes/owned-nats.server';
import { describeWithServer } from '../../../../test/support/servers';
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
});
