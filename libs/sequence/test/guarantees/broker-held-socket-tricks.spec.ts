import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Transport } from 'nest-sequence';
import * as bodyPool from '../../src/adapters/transports/body-pool';
import type { QueuedMessage } from '../support/broker-admin';
import { describeOnTransports, useTransportAdmin } from '../support/transports.fixture';
import {
  bytes,
  createSequenceTestApp,
  eventually,
  makeFragments,
  publishHeld,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { closeAll, type Closer } from '../support/test-app';

jest.setTimeout(60_000);

const PARTITIONS = 2;
const KiB = 1024;

/**
 * Broker-held reassembly with the transport's `unsafeSocketTricks`: the consumer's connection
 * receives large fragments (from 256 KiB on RabbitMQ, 64 KiB on NATS) in place and writes later
 * ones into the bodies the reassembler released once spooled. The bytes handed to the handler,
 * and those dead-lettered, must still be every fragment's own.
 */
describeOnTransports(
  'guarantees: broker-held reassembly with unsafeSocketTricks',
  [],
  (transport) => {
    const broker = useTransportAdmin(transport);
    const opened: Closer[] = [];
    let producer: Transport;
    let channel: string;

    beforeAll(async () => {
      producer = await transport.connect('nseq-held-tricks-producer');
    });
    afterAll(async () => {
      await producer.close();
    });
    beforeEach(() => {
      channel = broker.admin.newChannel();
      broker.admin.partitioned(channel, PARTITIONS);
    });
    afterEach(async () => {
      await closeAll(opened.splice(0));
    });

    async function app(handler: Record<string, unknown> = {}): Promise<SequenceTestApp> {
      const consumer = await transport.connect('nseq-held-tricks-consumer', {
        unsafeSocketTricks: true,
      });
      opened.push(() => consumer.close());
      const dir = mkdtempSync(join(tmpdir(), 'nseq-held-tricks-'));
      opened.push(() => rm(dir, { recursive: true, force: true }));
      const t = await createSequenceTestApp(channel, {
        transport: consumer,
        sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir } },
        handler,
      });
      opened.push(() => t.close());
      return t;
    }

    it('hands every handler its own bytes while bodies are reused', async () => {
      // Watches the released bodies go back to the connection (the real pool, called through).
      const recycle = jest.spyOn(bodyPool, 'recycleBody');
      opened.push(() => recycle.mockRestore());
      const { handler } = await app();
      const payloads = [bytes(1_500 * KiB + 3, 41), bytes(1_200 * KiB, 42), bytes(900 * KiB, 43)];
      const sequences = payloads.map((payload, index) =>
        makeFragments(`held-tricks-${index}`, payload, 300 * KiB),
      );
      // Interleaved: later fragments land in bodies released by other sequences.
      const longest = Math.max(...sequences.map((fragments) => fragments.length));
      for (let position = 0; position < longest; position++) {
        await publishHeld(
          producer,
          channel,
          sequences.flatMap((fragments) => fragments.slice(position, position + 1)),
          PARTITIONS,
        );
      }

      await eventually(
        () => handler.deliveries.length === payloads.length,
        'every sequence',
        20_000,
      );
      payloads.forEach((payload, index) => {
        const [delivered] = handler.of(`held-tricks-${index}`);
        expect(delivered.bytes.equals(payload)).toBe(true);
      });
      // Bodies the connection assembled in place were taken back for later ones.
      expect(recycle.mock.results.filter(({ value }) => value === true).length).toBeGreaterThan(0);
    });

    it('dead-letters every fragment whole, its own bytes, after its body was reused', async () => {
      const { handler } = await app({ handlerRetry: { attempts: 1 } });
      handler.failNext = 1;
      const fragments = makeFragments('held-tricks-fail', bytes(1_200 * KiB, 44), 300 * KiB);
      await publishHeld(producer, channel, fragments, PARTITIONS);

      const letters: QueuedMessage[] = [];
      await eventually(
        async () => {
          letters.push(...(await broker.admin.drain(`${channel}.dlq`)));
          return letters.length >= fragments.length;
        },
        'every fragment dead-lettered',
        40_000,
      );
      letters.sort(
        (a, b) =>
          Number(a.headers['x-sequence-position']) - Number(b.headers['x-sequence-position']),
      );
      // Compared as bytes: a deep equal of these buffers takes seconds.
      expect(letters).toHaveLength(fragments.length);
      expect(letters.map((letter, index) => letter.body.equals(fragments[index].body))).toEqual(
        fragments.map(() => true),
      );
      expect(handler.calls).toBe(1);
    });
  },
);
