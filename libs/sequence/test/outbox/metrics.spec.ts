import { randomUUID } from 'node:crypto';
import { MESSAGE_KIND_HEADER } from 'nest-sequence/wire';
import { PublishRejectedError } from 'nest-sequence';
import { STATS_TIMEOUT_MS } from '../../src/kernel/module-metrics';
import { BOX_NAMES } from '../../src/ports/outbox-store.port';
import { eventually, metricValue } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, inboxHandler, type OutboxTestApp } from './outbox-test-app';

const Handler = inboxHandler({ event: 'Counted' });

describe('Outbox / Inbox metrics', () => {
  let t: OutboxTestApp;

  afterEach(async () => {
    await t?.close();
  });

  const metric = (name: string, labels: Record<string, string>) =>
    metricValue(t.metrics.registry, `nest_sequence_${name}`, labels);

  it('count published, failed, received, duplicate and processed messages per box', async () => {
    t = await createOutboxTestApp(
      {
        outboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 2,
          },
        },
        inboxEvents: FAST_BOX,
      },
      [Handler],
    );
    t.transport.beforePublish = (attempt) => {
      if (attempt.channel === 'events.Refused') {
        throw new PublishRejectedError(attempt.channel, new Error('nack'));
      }
    };
    await t.outbox.transaction(async (tx) => {
      tx.publishEvent({ type: 'Counted', aggregateType: 'A', aggregateId: '1', payload: 1 });
      tx.publishEvent({ type: 'Counted', aggregateType: 'A', aggregateId: '2', payload: 2 });
      tx.publishEvent({ type: 'Refused', aggregateType: 'A', aggregateId: '3', payload: 3 });
    });
    await eventually(() => t.handler(Handler).calls.length === 2, 'both handled');
    // A copy of the first one again, as a relay's retry would publish it.
    const first = t.handler(Handler).calls[0].id;
    const body = JSON.stringify({
      id: first,
      type: 'Counted',
      aggregateType: 'A',
      aggregateId: '1',
      payload: 1,
      occurredAt: new Date().toISOString(),
    });
    await t.broker.publish('events.Counted', Buffer.from(body), { [MESSAGE_KIND_HEADER]: 'event' });
    await eventually(
      async () => (await metric('inbox_received_total', { outcome: 'duplicate' })) === 1,
      'the duplicate counted',
    );
    await eventually(
      async () => (await metric('outbox_failed', { box: 'outbox_events' })) === 1,
      'the refused one failed',
    );

    expect(await metric('outbox_published_total', { box: 'outbox_events' })).toBe(2);
    expect(
      await metric('outbox_attempts_failed_total', { box: 'outbox_events', outcome: 'retry' }),
    ).toBe(1);
    expect(
      await metric('outbox_attempts_failed_total', { box: 'outbox_events', outcome: 'failed' }),
    ).toBe(1);
    expect(await metric('inbox_received_total', { box: 'inbox_events', outcome: 'added' })).toBe(2);
    expect(await metric('inbox_processed_total', { box: 'inbox_events' })).toBe(2);
    expect(await metric('outbox_pending', { box: 'outbox_events' })).toBe(0);
    expect(await metric('outbox_latency_seconds_count', { box: 'outbox_events' })).toBe(2);
    expect(await metric('outbox_latency_seconds_count', { box: 'inbox_events' })).toBe(2);
  });

  it('report the pending count and the age of the oldest pending record', async () => {
    t = await createOutboxTestApp({ outboxEvents: { ...FAST_BOX, enabled: false } });
    await t.outbox.transaction(async (tx) => {
      tx.publishEvent({
        id: randomUUID(),
        type: 'Waiting',
        aggregateType: 'A',
        aggregateId: '1',
        payload: 1,
      });
    });
    await new Promise((resolve) => setTimeout(resolve, 1_100)); // past the gauges' 1 s snapshot
    expect(await metric('outbox_pending', { box: 'outbox_events' })).toBe(1);
    expect(
      await metric('outbox_oldest_pending_age_seconds', { box: 'outbox_events' }),
    ).toBeGreaterThanOrEqual(1);
  });

  // docs/health.md: a store that does not answer leaves the gauges at their last value and the
  // scrape still succeeds (each box's read is given STATS_TIMEOUT_MS).
  it('answer a scrape while the store does not answer, keeping the last values', async () => {
    t = await createOutboxTestApp({ outboxEvents: { ...FAST_BOX, enabled: false } });
    await t.outbox.transaction(async (tx) => {
      tx.publishEvent({ type: 'Waiting', aggregateType: 'A', aggregateId: '1', payload: 1 });
    });
    await eventually(
      async () => (await metric('outbox_pending', { box: 'outbox_events' })) === 1,
      'the pending record read by a scrape',
    );
    const line = (scrape: string, name: string) =>
      scrape.split('\n').find((l) => l.startsWith(`nest_sequence_${name}{box="outbox_events"} `));
    const before = await t.metrics.registry.metrics();
    expect(line(before, 'outbox_pending')).toBe(
      'nest_sequence_outbox_pending{box="outbox_events"} 1',
    );

    // A database that stopped answering: the call never settles.
    const store = await t.runtime.ready();
    const reads: string[] = [];
    store.stats = (box) => {
      reads.push(box);
      return new Promise(() => undefined);
    };
    await new Promise((resolve) => setTimeout(resolve, 1_050)); // past the 1 s snapshot
    let timer: NodeJS.Timeout | undefined;
    const during = await Promise.race([
      t.metrics.registry.metrics(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error('the scrape did not resolve')),
          5 * STATS_TIMEOUT_MS,
        );
      }),
    ]).finally(() => clearTimeout(timer));

    // Each box was read from the hung store, and its gauges kept the values read before.
    expect(reads.sort()).toEqual([...BOX_NAMES].sort());
    for (const name of ['outbox_pending', 'outbox_failed', 'outbox_oldest_pending_age_seconds']) {
      expect(line(before, name)).toMatch(/ \d/);
      expect(line(during, name)).toBe(line(before, name));
    }
    // Frozen gauges alert on nothing: the failed read is counted, per box, from 0.
    const failures = 'outbox_stats_failures_total';
    expect(line(before, failures)).toBe(`nest_sequence_${failures}{box="outbox_events"} 0`);
    const after = await t.metrics.registry.metrics();
    expect(line(after, failures)).toBe(`nest_sequence_${failures}{box="outbox_events"} 1`);
  });
});
