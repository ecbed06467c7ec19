import { randomUUID } from 'node:crypto';
import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SequenceModule, SplitterService } from 'nest-sequence';
import { sha256Hex } from '../../src/core/checksum';
import { encodedHeaders } from '../../src/ports/transport-headers';
import { bytes, eventually } from '../support/sequence-test-app';
import { namedTransport } from '../support/rabbitmq.fixture';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(60_000);

const MiB = 1024 * 1024;
/** The module's default `headerAllowanceBytes`: what the splitter leaves for headers. */
const HEADER_ALLOWANCE = 16 * 1024;

/**
 * A sequence's default fragment size comes from the transport's `maxMessageBytes` (minus the
 * header allowance), so that a producer that sets no `fragmentBytes` sends only messages the
 * broker takes: shown here on RabbitMQ, with a limit of the test's own and with the defaults.
 */
describeOnRealServers('faults: the default fragment size on RabbitMQ', () => {
  const opened: Array<() => Promise<void>> = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const close of opened.splice(0).reverse()) await close();
    },
  });

  /** A producer-only application: SplitterService over a transport of its own, no options. */
  async function producer(maxMessageBytes?: number): Promise<SplitterService> {
    const transport = await namedTransport(`nseq-fault-fragment-size-${randomUUID()}`, {
      transport: maxMessageBytes === undefined ? {} : { maxMessageBytes },
    });
    opened.push(() => transport.close());
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          metrics: false,
          tuning: { sweepers: { expiry: { intervalMs: false } } },
        }),
      ],
    }).compile();
    moduleRef.useLogger(false);
    const app: INestApplicationContext = await moduleRef.init();
    opened.push(() => app.close());
    return app.get(SplitterService);
  }

  it("cuts a payload into fragments of maxMessageBytes minus the header allowance: every message on the broker fits the transport's limit, headers included", async () => {
    const channel = servers.admin.newChannel();
    const splitter = await producer(MiB);
    const payload = bytes(3.5 * MiB, 81);

    const receipt = await splitter.send(channel, payload, { sequenceId: 'fits-one-mib' });

    expect(receipt.fragments).toBe(Math.ceil(payload.length / (MiB - HEADER_ALLOWANCE)));
    const queued = await servers.admin.drain(channel);
    expect(queued).toHaveLength(receipt.fragments);
    const positions = queued.map((message) => Number(message.headers['x-sequence-position']));
    expect([...positions].sort((a, b) => a - b)).toEqual([1, 2, 3, 4]);
    for (const message of queued) {
      const headers = encodedHeaders(message.headers);
      if (!('bytes' in headers)) throw new Error(`unencodable header ${headers.name}`);
      expect(message.body.length + headers.bytes).toBeLessThanOrEqual(MiB);
    }
    // All but the last are full: the default is the largest size that fits, not a smaller one.
    const inOrder = [...queued].sort(
      (a, b) => Number(a.headers['x-sequence-position']) - Number(b.headers['x-sequence-position']),
    );
    expect(inOrder.slice(0, -1).map((message) => message.body.length)).toEqual(
      [1, 2, 3].map(() => MiB - HEADER_ALLOWANCE),
    );
    expect(Buffer.concat(inOrder.map((message) => message.body)).equals(payload)).toBe(true);
  });

  it('with every default (16 MiB messages), carries a 40 MiB payload in 3 fragments through RabbitMQ and the Redis store, delivered once, byte-exact', async () => {
    const channel = servers.admin.newChannel();
    const consumer: RealServersApp = await createRealServersApp(channel, {
      prefix: servers.prefix,
    });
    opened.push(() => consumer.close());
    const splitter = await producer();
    const payload = bytes(40 * MiB, 82);

    const receipt = await splitter.send(channel, payload, { sequenceId: 'forty-mib' });

    expect(receipt).toMatchObject({ fragments: 3, bytes: payload.length });
    expect(receipt.sha256).toBe(sha256Hex(payload));
    await eventually(
      () => consumer.handler.of('forty-mib').length > 0,
      'the sequence delivered and read',
      30_000,
    );
    // Every fragment acknowledged, the completing one included (none ready, none held).
    await eventually(
      async () => {
        const { ready, unacked } = await servers.admin.totalCount(channel);
        return ready + unacked === 0;
      },
      'every fragment acknowledged',
      20_000,
    );
    expect(consumer.handler.calls).toBe(1);
    expect(consumer.handler.of('forty-mib')[0].bytes.equals(payload)).toBe(true);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
