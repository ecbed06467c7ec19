/**
 * A retry time written on a clock ahead of the relay's: by another instance whose clock runs
 * ahead, or by this machine before an NTP step set its clock back. No retry is ever scheduled
 * further than `retry.maxDelayMs` ahead, so such a record is due at once, not at the time it
 * names (which may be days away), and in an ordered box the rest of its aggregate follows it.
 * A minute past that is still waited out: a claim beside the relay's that read the clock later
 * schedules past the relay's `now + maxDelayMs` on the same clock.
 */
import type { OutboxStore } from 'nest-sequence/ports';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { describeWithServer, SERVERS } from '../support/servers';
import { usePostgres } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

const DAY_MS = 86_400_000;

const step = (n: number) => ({
  type: 'Step',
  aggregateType: 'Agg',
  aggregateId: 'a-1',
  payload: { n },
});

/**
 * Commits two events of one aggregate through an app whose relay is off, and gives the first
 * the state a refused publish leaves on a clock a day ahead: one attempt, due a day from now.
 * Then starts a relay on the store; resolves with the events it published, in order. Closes both
 * apps (not the store).
 */
async function relayAfterClockAhead(
  store: OutboxStore,
  /** `UPDATE` of the box's row (`$2`, `?`) to one attempt, due at the time (ms) given first. */
  scheduleAt: string,
): Promise<number[]> {
  const apps: OutboxTestApp[] = [];
  try {
    const writer = await createOutboxTestApp({
      store,
      outboxEvents: { enabled: false, ordered: true },
    });
    apps.push(writer);
    const [first] = await writer.outbox.transaction(async (tx) => [
      tx.publishEvent(step(1)),
      tx.publishEvent(step(2)),
    ]);
    await writer.outbox.transaction((tx) => tx.query(scheduleAt, [Date.now() + DAY_MS, first]));

    const relay = await createOutboxTestApp({
      store,
      outboxEvents: { ...FAST_BOX, ordered: true },
    });
    apps.push(relay);
    await eventually(
      () => relay.broker.peek('events.Step').length === 2,
      'both events published, though the first was scheduled a day ahead',
      3_000,
    );
    await eventually(
      async () => (await relay.outbox.stats('outbox_events')).pending === 0,
      'both marked COMPLETED',
    );
    return relay.broker
      .peek('events.Step')
      .map(
        (message) => (JSON.parse(message.body.toString()) as { payload: { n: number } }).payload.n,
      );
  } finally {
    for (const app of apps) await app.close();
  }
}

describe('Outbox relay: a retry scheduled on a clock ahead (SQLite)', () => {
  let store: SqliteOutboxStore | undefined;

  afterEach(async () => {
    await store?.close();
  });

  it('is due at once, not a day later, and its aggregate follows it in order', async () => {
    store = await SqliteOutboxStore.open({ filename: ':memory:' });
    const published = await relayAfterClockAhead(
      store,
      "UPDATE outbox_events SET attempts = 1, last_error = 'refused', next_attempt_at = ? " +
        'WHERE id = ?',
    );
    expect(published).toEqual([1, 2]);
  });

  it('waits out a retry due within a minute past maxDelayMs, as a claim that read the clock later schedules one', async () => {
    store = await SqliteOutboxStore.open({ filename: ':memory:' });
    const writer = await createOutboxTestApp({ store, outboxEvents: { enabled: false } });
    let relay: OutboxTestApp | undefined;
    try {
      const id = await writer.outbox.transaction(async (tx) => tx.publishEvent(step(1)));
      // FAST_BOX's maxDelayMs is 40: where a claim that read the clock 2 s after the relay's
      // next one schedules a retry at the latest.
      const dueAt = Date.now() + 2_000;
      await writer.outbox.transaction((tx) =>
        tx.query(
          "UPDATE outbox_events SET attempts = 1, last_error = 'refused', next_attempt_at = ? " +
            'WHERE id = ?',
          [dueAt, id],
        ),
      );
      relay = await createOutboxTestApp({ store, outboxEvents: FAST_BOX });
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      expect(relay.broker.peek('events.Step')).toHaveLength(0);
      await eventually(() => relay!.broker.peek('events.Step').length === 1, 'published', 5_000);
      expect(Date.now()).toBeGreaterThanOrEqual(dueAt);
    } finally {
      await relay?.close();
      await writer.close();
    }
  });
});

describeWithServer(
  'postgres',
  'Outbox relay: a retry scheduled on a clock ahead (PostgreSQL)',
  () => {
    let store: PostgresOutboxStore | undefined;
    const pg = usePostgres({ beforeCleanup: async () => store?.close() });

    it('is due at once, not a day later, and its aggregate follows it in order', async () => {
      store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: pg.tablePrefix });
      const published = await relayAfterClockAhead(
        store,
        `UPDATE ${pg.tablePrefix}outbox_events SET attempts = 1, last_error = 'refused', ` +
          'next_attempt_at = to_timestamp($1::float8 / 1000) WHERE id = $2',
      );
      expect(published).toEqual([1, 2]);
    });
  },
);
