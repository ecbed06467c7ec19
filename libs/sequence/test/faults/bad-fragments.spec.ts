import type { ConfirmChannel } from 'amqplib';
import {
  bytes,
  eventually,
  makeFragments,
  metricValue,
  shuffled,
  type TestFragment,
} from '../support/sequence-test-app';
import { type QueuedMessage } from '../support/rabbitmq.fixture';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { keysUnder } from '../support/redis.fixture';

jest.setTimeout(30_000);

const MAX_FRAGMENT_BYTES = 8_192;

/** A message as another program might publish it: a body and headers, or no headers at all. */
interface RawMessage {
  readonly body: Buffer;
  readonly headers?: Record<string, unknown>;
}

interface BadCase extends RawMessage {
  readonly name: string;
  /** The `x-death-reason` code it must be dead-lettered with. */
  readonly code: string;
}

/** One well-formed fragment of its own sequence, to spoil in one way. */
function goodSingle(name: string, length = 1_000): TestFragment {
  return makeFragments(`bad-${name}`, bytes(length, name.length * 13), length)[0];
}

function badCases(): BadCase[] {
  const crc = goodSingle('crc');
  const position = goodSingle('position');
  const missingId = goodSingle('missing-id');
  const version = goodSingle('version');
  const oversize = bytes(MAX_FRAGMENT_BYTES + 1, 5);
  const { ['x-sequence-id']: _id, ...withoutId } = missingId.headers;
  return [
    {
      name: 'wrong CRC-32',
      code: 'crc-mismatch',
      body: Buffer.concat([crc.body.subarray(0, 999), Buffer.from([crc.body[999] ^ 0xff])]),
      headers: crc.headers,
    },
    {
      name: 'non-integer position',
      code: 'malformed-header',
      body: position.body,
      headers: { ...position.headers, 'x-sequence-position': 1.5 },
    },
    {
      name: 'missing sequence id',
      code: 'malformed-header',
      body: missingId.body,
      headers: withoutId,
    },
    {
      name: 'unsupported version',
      code: 'unsupported-version',
      body: version.body,
      headers: { ...version.headers, 'x-sequence-version': 2 },
    },
    {
      name: 'body over maxFragmentBytes',
      code: 'fragment-too-large',
      body: oversize,
      headers: makeFragments('bad-oversize', oversize, oversize.length)[0].headers,
    },
    { name: 'no headers at all', code: 'malformed-header', body: Buffer.from('not a fragment') },
  ];
}

async function publishRaw(channel: ConfirmChannel, queue: string, messages: RawMessage[]) {
  for (const { body, headers } of messages) {
    channel.sendToQueue(
      queue,
      body,
      headers ? { headers, persistent: true } : { persistent: true },
    );
  }
  await channel.waitForConfirms();
}

/**
 * Guarantees table, rows "fragment fails CRC, bad headers" and "body over maxFragmentBytes", fed
 * by a program that is not this library: plain amqplib on a confirm channel, publishing straight
 * to the consumer's queue.
 */
describeOnRealServers('faults: bad fragments published straight to the queue', () => {
  let consumer: RealServersApp | undefined;
  const servers = useFaultServers({
    beforeCleanup: async () => {
      await consumer?.close();
      consumer = undefined;
    },
  });

  it('dead-letters each bad message with its reason and its headers, while 3 interleaved good sequences complete byte-exact', async () => {
    const channel = servers.admin.newChannel();
    // Declares the queue (and its .dlq) before anything is published to it.
    consumer = await createRealServersApp(channel, {
      prefix: servers.prefix,
      handler: { maxFragmentBytes: MAX_FRAGMENT_BYTES },
    });
    const good = [40_000, 24_000, 56_000].map((length, i) => ({
      id: `good-${i}`,
      payload: bytes(length, 110 + i),
    }));
    const bad = badCases();
    const publisher = await servers.admin.confirmChannel();
    try {
      await publishRaw(
        publisher,
        channel,
        shuffled<RawMessage>(
          [...good.flatMap(({ id, payload }) => makeFragments(id, payload, 4_000)), ...bad],
          111,
        ),
      );
    } finally {
      await publisher.close();
    }

    await eventually(
      () => good.every(({ id }) => consumer!.handler.of(id).length > 0),
      'the good sequences delivered',
      10_000,
    );
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) >= bad.length,
      'every bad message dead-lettered',
    );
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the queue drained',
    );

    for (const { id, payload } of good) {
      expect(consumer.handler.of(id)).toHaveLength(1);
      expect(consumer.handler.of(id)[0].bytes.equals(payload)).toBe(true);
    }
    expect(consumer.handler.calls).toBe(good.length);

    const deadLetters = await servers.admin.drain(`${channel}.dlq`);
    expect(deadLetters).toHaveLength(bad.length);
    for (const expected of bad) {
      const matching = deadLetters.filter((message) => message.body.equals(expected.body));
      expect({ name: expected.name, count: matching.length }).toEqual({
        name: expected.name,
        count: 1,
      });
      const [dead] = matching as [QueuedMessage];
      expect({ name: expected.name, headers: dead.headers }).toEqual({
        name: expected.name,
        headers: {
          ...expected.headers,
          'x-death-reason': expect.stringMatching(new RegExp(`^${expected.code}: `)) as string,
        },
      });
    }
    const rejected = (reason: string) =>
      metricValue(consumer!.metrics.registry, 'nest_sequence_fragments_rejected_total', {
        channel,
        reason,
      });
    expect({
      'crc-mismatch': await rejected('crc-mismatch'),
      'malformed-header': await rejected('malformed-header'),
      'unsupported-version': await rejected('unsupported-version'),
      'fragment-too-large': await rejected('fragment-too-large'),
    }).toEqual({
      'crc-mismatch': 1,
      'malformed-header': 3,
      'unsupported-version': 1,
      'fragment-too-large': 1,
    });
    // Refused before the store: none of the bad sequences left a key in Redis.
    expect(
      (await keysUnder(servers.redis, servers.prefix)).filter((key) => key.includes(':bad-')),
    ).toEqual([]);
  });
  it('dead-letters messages whose headers amqplib cannot send again, and the channel stays in step', async () => {
    const channel = servers.admin.newChannel();
    consumer = await createRealServersApp(channel, { prefix: servers.prefix });
    // Headers another program can publish (amqplib's typed-value form, '!', lets the test write
    // them) that amqplib cannot encode again once decoded: tables with a field named '!' or
    // 'hasOwnProperty', and headers too large once the reason is added. (A NaN cannot come this
    // way: RabbitMQ closes the connection of a publisher that sends one.)
    const poisoned: Array<{ name: string; headers: Record<string, unknown> }> = [
      { name: 'bang', headers: { bang: { '!': 'object', value: { '!': 'x' } } } },
      { name: 'own', headers: { own: { '!': 'object', value: { hasOwnProperty: 'x' } } } },
      { name: 'large', headers: { large: 'l'.repeat(61_400) } },
      // Not poisoned: typed values RabbitMQ carries (x-death's time is one) go on as they came.
      {
        name: 'typed',
        headers: {
          when: { '!': 'timestamp', value: 1_796_000_000 },
          price: { '!': 'decimal', value: { places: 2, digits: 1999 } },
        },
      },
    ];
    const bad = poisoned.map(({ name, headers }) => ({
      body: Buffer.from(`not a fragment: ${name}`),
      headers,
    }));
    const good = { id: 'good-after-poison', payload: bytes(20_000, 7) };
    const publisher = await servers.admin.confirmChannel();
    try {
      await publishRaw(publisher, channel, [
        ...bad,
        ...makeFragments(good.id, good.payload, 4_000),
      ]);
    } finally {
      await publisher.close();
    }

    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) >= bad.length,
      'every poisoned message dead-lettered',
    );
    await eventually(() => consumer!.handler.of(good.id).length > 0, 'the good sequence', 10_000);
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the queue drained (no message looping)',
    );

    const deadLetters = await servers.admin.drain(`${channel}.dlq`);
    expect(deadLetters).toHaveLength(bad.length);
    const byName = (name: string) =>
      deadLetters.find((message) => message.body.equals(Buffer.from(`not a fragment: ${name}`)))!
        .headers;
    for (const name of ['bang', 'own']) {
      expect(byName(name)).toEqual({
        [name]: expect.stringMatching(/^\(not forwarded: /) as string,
        'x-death-reason': expect.stringMatching(/^malformed-header: /) as string,
      });
    }
    expect(byName('typed')).toEqual({
      when: { '!': 'timestamp', value: 1_796_000_000 },
      price: { '!': 'decimal', value: { places: 2, digits: 1999 } },
      'x-death-reason': expect.stringMatching(/^malformed-header: /) as string,
    });
    expect(byName('large')).toEqual({
      'x-dropped-headers': 'large',
      'x-death-reason': expect.stringMatching(/^malformed-header: /) as string,
    });
    expect(consumer.handler.of(good.id)).toHaveLength(1);
    expect(consumer.handler.of(good.id)[0].bytes.equals(good.payload)).toBe(true);
  });
});
