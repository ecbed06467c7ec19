import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  type OutboxTestApp,
} from '../outbox/outbox-test-app';
import { createResequencerTestApp, publishEvent } from '../resequencer/resequencer-test-app';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
} from '../support/sequence-test-app';
import type { Registry } from 'prom-client';

const DEAD_LETTERS = 'nest_sequence_dead_letters_total';

/** Every sample of `nest_sequence_dead_letters_total`, as `channel reason value` lines. */
async function deadLetterSamples(registry: Registry): Promise<string[]> {
  const metric = await registry.getSingleMetric(DEAD_LETTERS)?.get();
  return (metric?.values ?? [])
    .map(({ labels, value }) => `${labels.channel} ${labels.reason} ${value}`)
    .sort();
}

/**
 * `nest_sequence_dead_letters_total{channel,reason}` counts what reaches the dead-letter channels,
 * whichever path put it there: a disposition of a subscription (any pattern), or a record the
 * module publishes itself (an expired sequence, a resequencer's gap outcome).
 */
describe('dead_letters_total', () => {
  it('counts a fragment dead-lettered by the aggregator, by its reason code', async () => {
    const channel = 'observability.dl.crc';
    const t = await createSequenceTestApp(channel);
    try {
      const [fragment] = makeFragments('s-crc', bytes(2_000, 3), 1_000);
      const corrupt = { ...fragment, body: Buffer.from(fragment.body).fill(0) };
      await publishAll(t.transport, channel, [corrupt]);
      await t.transport.whenIdle();

      expect(deadLetters(t.transport, channel)).toHaveLength(1);
      expect(await deadLetterSamples(t.metrics.registry)).toEqual([`${channel} crc-mismatch 1`]);
    } finally {
      await t.close();
    }
  });

  it('counts the expiry record the sweeper publishes, once per expired sequence', async () => {
    const channel = 'observability.dl.expiry';
    const t = await createSequenceTestApp(channel, { handler: { timeoutMs: 1_000 } });
    try {
      const fragments = makeFragments('s-gap', bytes(3_000, 5), 1_000);
      await publishAll(t.transport, channel, [fragments[0]]);
      await t.transport.whenIdle();
      expect(await deadLetterSamples(t.metrics.registry)).toEqual([]);

      expect(await t.sweeper.sweep(Date.now() + 60_000)).toBe(1);
      expect(await t.sweeper.sweep(Date.now() + 120_000)).toBe(0);

      expect(deadLetters(t.transport, channel)).toHaveLength(1);
      expect(await deadLetterSamples(t.metrics.registry)).toEqual([
        `${channel} sequence-expired 1`,
      ]);
    } finally {
      await t.close();
    }
  });

  it("counts a resequencer's gap record under its input channel", async () => {
    const channel = 'observability.dl.transfers';
    const t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: 10_000, policy: 'alert' },
    });
    try {
      await publishEvent(t.transport, channel, 'T1', 2);
      await eventually(
        async () => (await t.service.buffered(channel, 'T1')).length === 1,
        'the event buffered behind its gap',
      );
      await t.sweeper.sweep(Date.now() + 10_001);

      expect(t.transport.peek(`${channel}.dlq`)).toHaveLength(1);
      expect(await deadLetterSamples(t.metrics.registry)).toEqual([
        `${channel} resequencer-gap-alert 1`,
      ]);
    } finally {
      await t.close();
    }
  });

  it("counts a resequencer's refused input event (a disposition of its subscription)", async () => {
    const channel = 'observability.dl.invalid';
    const t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: 10_000, policy: 'alert' },
    });
    try {
      await t.transport.publish(channel, Buffer.from('no key'), { 'x-resequence-seq': 1 });
      await eventually(
        () => t.transport.peek(`${channel}.dlq`).length === 1,
        'the refused event on the dead-letter channel',
      );
      expect(await deadLetterSamples(t.metrics.registry)).toEqual([
        `${channel} invalid-resequence-event 1`,
      ]);
    } finally {
      await t.close();
    }
  });

  describe('inbox', () => {
    let t: OutboxTestApp;
    afterEach(async () => {
      await t?.close();
    });

    it('counts messages an inbox refuses', async () => {
      const channel = 'events.ObservedThing';
      t = await createOutboxTestApp({ inboxEvents: FAST_BOX }, [
        inboxHandler({ event: 'ObservedThing' }),
      ]);
      const headers = {
        [MESSAGE_ID_HEADER]: 'm-1',
        [MESSAGE_KIND_HEADER]: 'event',
        [MESSAGE_TYPE_HEADER]: 'ObservedThing',
      };
      await t.broker.publish(channel, Buffer.from('not json'), headers);
      await t.broker.publish(channel, Buffer.from('nor this'), {
        ...headers,
        [MESSAGE_ID_HEADER]: 'm-2',
      });
      await eventually(() => deadLetters(t.broker, channel).length === 2, 'two dead letters');

      expect(
        await metricValue(t.metrics.registry, DEAD_LETTERS, {
          channel,
          reason: 'invalid-inbox-message',
        }),
      ).toBe(2);
    });
  });
});
