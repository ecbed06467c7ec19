import { randomUUID } from 'node:crypto';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { NatsTransport } from 'nest-sequence/nats';
import { PublishRejectedError, SequencePublishError, type InboundMessage } from 'nest-sequence';
import { connectNats, natsHeaders } from '../../src/adapters/transports/nats/nats.client';
import { streamName } from '../../src/adapters/transports/nats/nats.naming';
import { useBrokerAdmin } from '../support/broker-admin';
import { NatsAdmin } from '../support/nats.fixture';
import { OwnedNatsServer } from '../support/processes/owned-nats.server';
import {
  bytes,
  createSequenceTestApp,
  eventually,
  FaultInjectingTransport,
  makeFragments,
  shuffled,
  type SequenceTestApp,
  type TestFragment,
} from '../support/sequence-test-app';
import { describeWithServer, SERVERS } from '../support/servers';

jest.setTimeout(60_000);

const MAX_FRAGMENT_BYTES = 8_192;

/**
 * Message Sequence over NATS JetStream, end to end: the module on a `NatsTransport`, fed by the
 * splitter or by a plain NATS client, and a server restarted mid-transfer.
 */
describeWithServer('nats', 'faults: Message Sequence over NATS JetStream', () => {
  const opened: Array<{ close(): Promise<void> }> = [];
  const nats = useBrokerAdmin(() => NatsAdmin.connect(), {
    beforeCleanup: async () => {
      for (const each of opened.splice(0).reverse()) await each.close();
    },
  });
  const newChannel = () => nats.admin.newChannel();

  async function natsApp(
    channel: string,
    transport: NatsTransport,
    options: Parameters<typeof createSequenceTestApp>[1] = {},
  ): Promise<SequenceTestApp> {
    const app = await createSequenceTestApp(channel, { ...options, transport });
    opened.push({ close: () => transport.close() }, app);
    return app;
  }

  it("splits by the server's max_payload and reassembles a 5 MB payload once, byte-exact", async () => {
    const channel = newChannel();
    const transport = await NatsTransport.connect({ servers: SERVERS.nats.url });
    const t = await natsApp(channel, transport);
    const payload = bytes(5_000_000, 21);

    const receipt = await t.splitter.send(channel, payload, { sequenceId: 'nats-5mb' });

    await eventually(() => t.handler.of('nats-5mb').length === 1, 'the reassembled payload');
    expect(receipt.fragments).toBe(
      Math.ceil(payload.length / (transport.maxMessageBytes - 16_384)),
    );
    expect(receipt.fragments).toBeGreaterThan(4);
    expect(t.handler.of('nats-5mb')[0].bytes.equals(payload)).toBe(true);
    expect(t.handler.calls).toBe(1);
  });

  it('dead-letters each bad fragment a plain NATS client publishes, with its reason, while good sequences complete', async () => {
    const channel = newChannel();
    const transport = await NatsTransport.connect({ servers: SERVERS.nats.url });
    const t = await natsApp(channel, transport, {
      handler: { maxFragmentBytes: MAX_FRAGMENT_BYTES },
    });
    const dead: InboundMessage[] = [];
    const observer = await NatsTransport.connect({ servers: SERVERS.nats.url });
    opened.push(observer);
    await observer.subscribe(observer.deadLetterChannel(channel), async (message) => {
      dead.push(message);
      return { action: 'ack' };
    });

    const single = (name: string, length = 1_000): TestFragment =>
      makeFragments(`bad-${name}`, bytes(length, name.length * 13), length)[0];
    const crc = single('crc');
    const position = single('position');
    const version = single('version');
    const oversize = bytes(MAX_FRAGMENT_BYTES + 1, 5);
    const bad = [
      {
        code: 'crc-mismatch',
        body: Buffer.concat([crc.body.subarray(0, 999), Buffer.from([crc.body[999] ^ 0xff])]),
        headers: crc.headers,
      },
      {
        code: 'malformed-header',
        body: position.body,
        headers: { ...position.headers, 'x-sequence-position': '1.5' },
      },
      {
        code: 'unsupported-version',
        body: version.body,
        headers: { ...version.headers, 'x-sequence-version': 2 },
      },
      {
        code: 'fragment-too-large',
        body: oversize,
        headers: makeFragments('bad-oversize', oversize, oversize.length)[0].headers,
      },
      { code: 'malformed-header', body: Buffer.from('not a fragment'), headers: {} },
    ];
    const good = [30_000, 20_000].map((length, i) => ({
      id: `good-${i}`,
      payload: bytes(length, 70 + i),
    }));
    const messages = shuffled(
      [...good.flatMap(({ id, payload }) => makeFragments(id, payload, 4_000)), ...bad],
      5,
    );

    // Another program: the plain client, every header value a string.
    const plain = await connectNats({ servers: SERVERS.nats.url });
    const js = jetstream(plain);
    for (const { body, headers } of messages) {
      const wire = natsHeaders();
      for (const [name, value] of Object.entries(headers)) wire.append(name, String(value));
      await js.publish(channel, body, { headers: wire as never });
    }
    await plain.close();

    await eventually(() => good.every(({ id }) => t.handler.of(id).length === 1), 'good sequences');
    await eventually(() => dead.length >= bad.length, 'every bad fragment dead-lettered');
    for (const { id, payload } of good)
      expect(t.handler.of(id)[0].bytes.equals(payload)).toBe(true);
    for (const expected of bad) {
      const [letter, ...more] = dead.filter((message) => message.body.equals(expected.body));
      expect(more).toHaveLength(0);
      expect(letter.headers['x-death-reason']).toMatch(new RegExp(`^${expected.code}: `));
    }
    expect(dead).toHaveLength(bad.length);
  });

  it('fails a send into a full stream with SequencePublishError naming the sequence and position', async () => {
    const channel = newChannel();
    const admin = await connectNats({ servers: SERVERS.nats.url });
    await (
      await jetstreamManager(admin)
    ).streams.add({
      name: streamName('NSEQ_', channel),
      subjects: [channel],
      max_msgs: 3,
      discard: 'new',
    } as never);
    await admin.close();
    const transport = await NatsTransport.connect({ servers: SERVERS.nats.url });
    const t = await createSequenceTestApp(channel, {
      transport,
      publish: { retry: { attempts: 2, baseDelayMs: 10, maxDelayMs: 10 } },
    });
    opened.push(transport, t);

    const sent = t.splitter.send(channel, bytes(10_000, 5), {
      sequenceId: 'too-many',
      fragmentBytes: 1_000,
    });

    await expect(sent).rejects.toBeInstanceOf(SequencePublishError);
    const error = (await sent.catch((caught: unknown) => caught)) as SequencePublishError;
    // The stream takes 3: the first fragment refused is one after those (several are in flight).
    expect(error).toMatchObject({ channel, sequenceId: 'too-many' });
    expect(error.position).toBeGreaterThanOrEqual(4);
    expect(error.cause).toBeInstanceOf(PublishRejectedError);
    expect(error.message).toMatch(/sequence too-many .* fragment \d+ was not confirmed/);
  });

  describe('on a server of its own', () => {
    let server: OwnedNatsServer;

    beforeEach(async () => {
      server = await OwnedNatsServer.start();
    });

    afterEach(async () => {
      await server.dispose();
    });

    it('completes a sequence once when nats-server is killed and restarted mid-transfer', async () => {
      const channel = `restart.${randomUUID()}`;
      const own = await NatsTransport.connect({ servers: server.url, reconnectTimeWait: 100 });
      const transport = new FaultInjectingTransport(own);
      let restarted: Promise<void> | undefined;
      transport.beforePublish = async ({ position, attempt }) => {
        if (position !== 20 || attempt !== 1 || restarted) return;
        await server.stop();
        restarted = new Promise((resolve) => setTimeout(resolve, 1_000)).then(() =>
          server.restart(),
        );
      };
      const t = await createSequenceTestApp(channel, { transport });
      opened.push(own, t);
      const payload = bytes(2_000_000, 33);

      await t.splitter.send(channel, payload, {
        sequenceId: 'across-restart',
        fragmentBytes: 50_000,
      });
      expect(restarted).toBeDefined();
      await restarted;

      await eventually(
        () => t.handler.of('across-restart').length === 1,
        'the sequence completed',
        30_000,
      );
      await new Promise((resolve) => setTimeout(resolve, 1_000)); // room for a second completion
      expect(t.handler.calls).toBe(1);
      expect(t.handler.of('across-restart')[0].bytes.equals(payload)).toBe(true);
      // Nothing left behind on the restarted server, nothing dead-lettered.
      const ownAdmin = await NatsAdmin.connect(server.url);
      try {
        expect(await ownAdmin.readyCount(channel)).toBe(0);
        expect(await ownAdmin.readyCount(`${channel}.dlq`)).toBe(0);
      } finally {
        await ownAdmin.close();
      }
    });
  });
});
