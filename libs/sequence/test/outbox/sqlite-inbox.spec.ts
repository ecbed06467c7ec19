import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Injectable, type Type } from '@nestjs/common';
import BetterSqlite3 from 'better-sqlite3';
import { InboxHandler, OutboxService, type InboxContext, type OutboxEvent } from 'nest-sequence';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER } from 'nest-sequence/wire';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, ledgerWriter, type OutboxTestApp } from './outbox-test-app';

/**
 * Inbox handlers that misbehave, on SQLite. One connection writes at a time there: the claim's
 * transaction holds it while the batch's handlers run.
 */
describe('Inbox on SQLite: handlers that misbehave', () => {
  let dir: string;
  let t: OutboxTestApp | undefined;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'nseq-sqlite-inbox-'));
  });

  afterEach(async () => {
    await t?.close();
    t = undefined;
    rmSync(dir, { recursive: true, force: true });
  });

  /**
   * `count` PaymentSettled events (payload `{ n }`) recorded with the inbox off, then an app
   * whose inbox handles them, in one claim; their ids, in order.
   */
  async function deliverInOneClaim(
    filename: string,
    providers: Type[],
    count: number,
    attempts: number,
  ): Promise<string[]> {
    const start = async (enabled: boolean) =>
      createOutboxTestApp(
        {
          store: await SqliteOutboxStore.open({ filename }),
          inboxEvents: { ...FAST_BOX, enabled, retry: { ...FAST_BOX.retry, attempts } },
        },
        providers,
      );
    t = await start(false);
    const ids: string[] = [];
    for (let n = 0; n < count; n++) {
      const id = randomUUID();
      const event = { id, type: 'PaymentSettled', aggregateType: 'Payment', aggregateId: `p${n}` };
      await t.broker.publish(
        'events.PaymentSettled',
        Buffer.from(
          JSON.stringify({ ...event, payload: { n }, occurredAt: new Date().toISOString() }),
        ),
        { [MESSAGE_ID_HEADER]: id, [MESSAGE_KIND_HEADER]: 'event' },
      );
      const recorded = t;
      await eventually(
        async () => (await recorded.outbox.record('inbox_events', id))?.status === 'PENDING',
        `message ${n} recorded`,
      );
      ids.push(id);
    }
    await t.close();
    t = await start(true);
    return ids;
  }

  it('a transaction() a handler left running joins the claim: waited for by a later handler of the batch, it does not deadlock', async () => {
    const filename = join(dir, 'outbox.db');
    let detachedDone!: () => void;
    const detached = new Promise<void>((resolve) => (detachedDone = resolve));
    @Injectable()
    class Notifier {
      constructor(private readonly outbox: OutboxService) {}
      @InboxHandler({ event: 'PaymentSettled' })
      async handle(event: OutboxEvent<{ n: number }>) {
        if (event.payload.n === 0) {
          // An EventEmitter listener, say, that this handler starts and does not await.
          void (async () => {
            await new Promise((resolve) => setTimeout(resolve, 50));
            await this.outbox.transaction(async () => undefined);
            detachedDone();
          })();
          return;
        }
        // The next record of the batch waits for it. Opening a transaction of its own, it would
        // wait for the one connection, which this claim holds until this handler returns.
        await detached;
      }
    }
    const ids = await deliverInOneClaim(filename, [Notifier], 2, 1);

    const app = t!;
    await eventually(
      async () => {
        const statuses = await Promise.all(
          ids.map(async (id) => (await app.outbox.record('inbox_events', id))?.status),
        );
        return statuses.every((status) => status === 'COMPLETED');
      },
      'both handled',
      5_000,
    );
  }, 15_000);

  it('a handler whose writes break a deferred foreign key, found only at COMMIT, counts an attempt (FAILED after maxAttempts); its neighbours complete once', async () => {
    const filename = join(dir, 'outbox.db');
    const setup = new BetterSqlite3(filename);
    setup.exec(`CREATE TABLE account (name TEXT PRIMARY KEY);
      INSERT INTO account VALUES ('main');
      CREATE TABLE ledger (n INTEGER PRIMARY KEY, account TEXT NOT NULL
        REFERENCES account DEFERRABLE INITIALLY DEFERRED);`);
    setup.close();
    // Accepted at the INSERT, checked at COMMIT: entry 1 names an account that does not exist.
    const { Ledger, calls } = ledgerWriter('INSERT INTO ledger VALUES (?, ?)');
    const [first, broken, last] = await deliverInOneClaim(filename, [Ledger], 3, 3);
    const app = t!;
    await eventually(
      async () => (await app.outbox.record('inbox_events', broken))?.status === 'FAILED',
      'the broken one failed',
    );
    expect(await app.outbox.record('inbox_events', broken)).toMatchObject({
      attempts: 3,
      lastError: expect.stringMatching(/FOREIGN KEY constraint failed/),
    });
    for (const id of [first, last]) {
      expect(await app.outbox.record('inbox_events', id)).toMatchObject({
        status: 'COMPLETED',
        attempts: 1,
      });
    }
    await app.close();
    t = undefined;
    const check = new BetterSqlite3(filename, { readonly: true });
    expect(check.prepare('SELECT n FROM ledger ORDER BY n').all()).toEqual([{ n: 0 }, { n: 2 }]);
    check.close();
    // One call in the first claim, then one per attempt: not a call at every poll.
    expect(calls.get(1)).toBeLessThanOrEqual(4);
    expect(calls.get(0)).toBeLessThanOrEqual(2);
  }, 15_000);

  it('a handler whose write fills the disk (SQLite rolls the claim back) counts an attempt (FAILED after maxAttempts); its neighbours complete', async () => {
    const filename = join(dir, 'outbox.db');
    const setup = new BetterSqlite3(filename);
    setup.exec('CREATE TABLE blobs (n INTEGER PRIMARY KEY, v TEXT NOT NULL)');
    setup.close();
    const calls = new Map<number, number>();
    @Injectable()
    class Archive {
      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(event: OutboxEvent<{ n: number }>, { transaction }: InboxContext) {
        const { n } = event.payload;
        calls.set(n, (calls.get(n) ?? 0) + 1);
        const database = transaction!.client as BetterSqlite3.Database;
        // Entry 1 finds the disk full: SQLITE_FULL, and SQLite rolls the whole transaction back.
        const limit = database.pragma('max_page_count', { simple: true }) as number;
        if (n === 1)
          database.pragma(
            `max_page_count = ${database.pragma('page_count', { simple: true }) as number}`,
          );
        try {
          await transaction!.query('INSERT INTO blobs VALUES (?, ?)', [n, 'x'.repeat(100_000)]);
        } finally {
          database.pragma(`max_page_count = ${limit}`);
        }
      }
    }
    const [first, full, last] = await deliverInOneClaim(filename, [Archive], 3, 3);
    const app = t!;
    await eventually(
      async () => (await app.outbox.record('inbox_events', full))?.status === 'FAILED',
      'the one filling the disk failed',
      5_000,
    );
    expect(await app.outbox.record('inbox_events', full)).toMatchObject({
      attempts: 3,
      lastError: expect.stringMatching(/full/),
    });
    for (const id of [first, last]) {
      await eventually(
        async () => (await app.outbox.record('inbox_events', id))?.status === 'COMPLETED',
        'its neighbours completed',
      );
      expect(await app.outbox.record('inbox_events', id)).toMatchObject({ attempts: 1 });
    }
    expect(calls.get(1)).toBe(3);
  }, 15_000);
});
