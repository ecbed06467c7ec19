import { SqliteOutboxStore } from '../adapters/stores/sqlite/sqlite.outbox-store';
import type { OutboxRuntime } from '../outbox/outbox.runtime';
import { failedAttempt } from '../outbox/retry-schedule';
import { BoxesReader } from './boxes.reader';

/**
 * docs/console.md: `failedAt` of a failed row "is when its last attempt was due". A record that
 * failed on its first attempt (an unsendable message, a body that does not parse, or
 * retry.attempts: 1) was due when it was appended, not at the stores' next_attempt_at of a fresh
 * row (the epoch).
 */
describe('BoxesReader.failed: failedAt', () => {
  let store: SqliteOutboxStore;

  beforeEach(async () => {
    store = await SqliteOutboxStore.open({ filename: ':memory:' });
    await store.migrate();
  });
  afterEach(() => store.close());

  it('is not before the row was created for a row that failed on its first attempt', async () => {
    await store.transaction((tx) =>
      store.append(
        'outbox_events',
        [{ id: 'poison', kind: 'event', type: 'T', partitionKey: null, body: '{}', headers: {} }],
        tx,
      ),
    );
    await store.claim('outbox_events', { limit: 10, now: Date.now() }, async (batch) =>
      batch.records.map((record) =>
        failedAttempt(
          record,
          new Error('too large'),
          Date.now(),
          { retry: { attempts: 10, baseDelayMs: 1000, maxDelayMs: 300_000 } },
          true,
        ),
      ),
    );
    const runtime = { inUse: true, ready: async () => store } as unknown as OutboxRuntime;
    const [row] = await new BoxesReader(runtime).failed('outbox', 10);

    expect(row).toMatchObject({ id: 'poison', attempts: 1 });
    expect(row.failedAt).toBeGreaterThanOrEqual(row.createdAt);
  });
});
