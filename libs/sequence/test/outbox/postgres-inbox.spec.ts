import { randomUUID } from 'node:crypto';
import { Injectable, type Type } from '@nestjs/common';
import { Pool } from 'pg';
import { InboxHandler, OutboxService, type InboxContext, type OutboxEvent } from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import type { OutboxOptions } from '../../src/options/outbox.options';
import { describeWithServer, SERVERS } from '../support/servers';
import { postgresPool } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import {
  createOutboxTestApp,
  FAST_BOX,
  ledgerWriter,
  publishInboxEvent,
  type OutboxTestApp,
} from './outbox-test-app';

const BOXES = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];

const stores: PostgresOutboxStore[] = [];
/** `PostgresOutboxStore.connect`, closed after the test. */
function connectStore(
  ...args: Parameters<typeof PostgresOutboxStore.connect>
): PostgresOutboxStore {
  const store = PostgresOutboxStore.connect(...args);
  stores.push(store);
  return store;
}

/** Inbox handlers that misbehave, on PostgreSQL: none of them may stall the inbox. */
describeWithServer('postgres', 'Inbox on PostgreSQL: handlers that misbehave', () => {
  let admin: Pool;
  let prefix: string;
  let t: OutboxTestApp | undefined;

  beforeAll(() => {
    admin = postgresPool({ max: 2 });
  });

  beforeEach(() => {
    prefix = `ib${randomUUID().replace(/-/g, '').slice(0, 10)}_`;
  });

  afterEach(async () => {
    await t?.close();
    t = undefined;
    // The app does not close a store it was given: left open, their pools add up to the
    // server's max_connections over this file.
    for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    for (const table of [...BOXES, 'outbox_migrations', 'ledger', 'account']) {
      await admin.query(`DROP TABLE IF EXISTS ${prefix}${table}`);
    }
  });

  afterAll(async () => {
    await admin.end();
  });

  async function deliver(n: number): Promise<string> {
    return publishInboxEvent(t!.broker, 'PaymentSettled', {
      aggregateType: 'Payment',
      aggregateId: `p${n}`,
      payload: { n },
    });
  }

  const statusOf = async (id: string) => (await t!.outbox.record('inbox_events', id))?.status;

  it('a handler that swallows its own SQL error is FAILED after maxAttempts; the others complete', async () => {
    @Injectable()
    class Ledger {
      calls = 0;
      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(event: OutboxEvent<{ n: number }>, { transaction }: InboxContext) {
        this.calls++;
        if (event.payload.n === 1) {
          // "idempotent insert": the duplicate key is caught, which leaves the transaction aborted
          await transaction!
            .query(`INSERT INTO ${prefix}ledger VALUES (1), (1)`)
            .catch(() => undefined);
          return;
        }
        await transaction!.query(`INSERT INTO ${prefix}ledger VALUES ($1)`, [event.payload.n]);
      }
    }
    await admin.query(`CREATE TABLE ${prefix}ledger (n int PRIMARY KEY)`);
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 3,
          },
        },
      },
      [Ledger],
    );
    const [first, broken, last] = [await deliver(0), await deliver(1), await deliver(2)];
    await eventually(async () => (await statusOf(broken)) === 'FAILED', 'the broken one failed');
    expect(await statusOf(first)).toBe('COMPLETED');
    expect(await statusOf(last)).toBe('COMPLETED');
    const failed = await t.outbox.record('inbox_events', broken);
    expect(failed?.attempts).toBe(3);
    expect(failed?.lastError).toMatch(/aborted/);
    const { rows } = await admin.query(`SELECT n FROM ${prefix}ledger ORDER BY n`);
    expect(rows).toEqual([{ n: 0 }, { n: 2 }]);
  });

  /** Records delivered while the processor is off, so that one claim takes them together. */
  async function deliverInOneClaim(
    options: {
      store: () => PostgresOutboxStore;
      inboxEvents: NonNullable<OutboxOptions['inboxEvents']>;
    },
    providers: Type[],
    count: number,
  ): Promise<string[]> {
    t = await createOutboxTestApp(
      { store: options.store(), inboxEvents: { ...options.inboxEvents, enabled: false } },
      providers,
    );
    const ids: string[] = [];
    for (let n = 0; n < count; n++) {
      const id = await deliver(n);
      // One at a time: the receiver may record messages delivered together in any order.
      await eventually(async () => (await statusOf(id)) === 'PENDING', `message ${n} recorded`);
      ids.push(id);
    }
    await t.close();
    t = await createOutboxTestApp(
      { store: options.store(), inboxEvents: options.inboxEvents },
      providers,
    );
    return ids;
  }

  it('a handler statement that outruns query_timeout counts an attempt (FAILED after maxAttempts) without stalling the box: its neighbours complete, each committed once', async () => {
    @Injectable()
    class Ledger {
      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(event: OutboxEvent<{ n: number }>, { transaction }: InboxContext) {
        // Longer than the pool's query_timeout: the client gives up on it, and the claim's
        // connection is lost with everything the claim did so far.
        if (event.payload.n === 1) await transaction!.query('SELECT pg_sleep(0.5)');
        await transaction!.query(`INSERT INTO ${prefix}ledger VALUES ($1)`, [event.payload.n]);
      }
    }
    await admin.query(`CREATE TABLE ${prefix}ledger (n int PRIMARY KEY)`);
    const [first, slow, last] = await deliverInOneClaim(
      {
        store: () =>
          connectStore(SERVERS.postgres.url, {
            tablePrefix: prefix,
            pool: { query_timeout: 300 },
          }),
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 3,
          },
        },
      },
      [Ledger],
      3,
    );
    await eventually(
      async () => (await statusOf(slow)) === 'FAILED',
      'the slow one failed',
      15_000,
    );
    expect(await t!.outbox.record('inbox_events', slow)).toMatchObject({
      attempts: 3,
      lastError: expect.stringMatching(/Query read timeout/),
    });
    await eventually(async () => (await statusOf(last)) === 'COMPLETED', 'the last one handled');
    // The slow one's neighbours never counted a failed attempt for it: their handling was
    // rolled back with the lost claim and done again, and committed once.
    for (const id of [first, last]) {
      expect(await t!.outbox.record('inbox_events', id)).toMatchObject({
        status: 'COMPLETED',
        attempts: 1,
        lastError: null,
      });
    }
    const { rows } = await admin.query(`SELECT n FROM ${prefix}ledger ORDER BY n`);
    expect(rows).toEqual([{ n: 0 }, { n: 2 }]);
  });

  it('a handler whose writes break a deferred constraint, found only at COMMIT, counts an attempt (FAILED after maxAttempts); its neighbours complete once', async () => {
    // Accepted at the INSERT, checked at COMMIT: entry 1 names an account that does not exist.
    const { Ledger, calls } = ledgerWriter(`INSERT INTO ${prefix}ledger VALUES ($1, $2)`);
    await admin.query(`CREATE TABLE ${prefix}account (name text PRIMARY KEY)`);
    await admin.query(`INSERT INTO ${prefix}account VALUES ('main')`);
    await admin.query(
      `CREATE TABLE ${prefix}ledger (n int PRIMARY KEY, account text NOT NULL
         REFERENCES ${prefix}account DEFERRABLE INITIALLY DEFERRED)`,
    );
    const [first, broken, last] = await deliverInOneClaim(
      {
        store: () => connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 3 } },
      },
      [Ledger],
      3,
    );
    await eventually(async () => (await statusOf(broken)) === 'FAILED', 'the broken one failed');
    expect(await t!.outbox.record('inbox_events', broken)).toMatchObject({
      attempts: 3,
      lastError: expect.stringMatching(/foreign key constraint/),
    });
    for (const id of [first, last]) {
      expect(await t!.outbox.record('inbox_events', id)).toMatchObject({
        status: 'COMPLETED',
        attempts: 1,
      });
    }
    const { rows } = await admin.query(`SELECT n FROM ${prefix}ledger ORDER BY n`);
    expect(rows).toEqual([{ n: 0 }, { n: 2 }]);
    // One call in the first claim, then one per attempt: not a call at every poll.
    expect(calls.get(1)).toBeLessThanOrEqual(4);
    expect(calls.get(0)).toBeLessThanOrEqual(2);
  });

  it("a handler statement waiting on a lock past query_timeout counts an attempt too: the lost claim's server process is ended, so its row locks do not outlast it", async () => {
    @Injectable()
    class Ledger {
      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(event: OutboxEvent<{ n: number }>, { transaction }: InboxContext) {
        // Waits on a row another transaction holds: PostgreSQL goes on waiting after the client
        // gave up, with the claim's row locks, unless the process is ended.
        await transaction!.query(`UPDATE ${prefix}ledger SET n = n WHERE n = $1`, [
          event.payload.n,
        ]);
      }
    }
    await admin.query(`CREATE TABLE ${prefix}ledger (n int PRIMARY KEY)`);
    await admin.query(`INSERT INTO ${prefix}ledger VALUES (0)`);
    const holder = await admin.connect();
    try {
      await holder.query('BEGIN');
      await holder.query(`SELECT n FROM ${prefix}ledger WHERE n = 0 FOR UPDATE`);
      const [held] = await deliverInOneClaim(
        {
          store: () =>
            connectStore(SERVERS.postgres.url, {
              tablePrefix: prefix,
              pool: { query_timeout: 300 },
            }),
          inboxEvents: {
            ...FAST_BOX,
            retry: {
              ...FAST_BOX.retry,
              attempts: 2,
            },
          },
        },
        [Ledger],
        1,
      );
      // Before, the relock waited behind the lost process and timed out too: PENDING, 0 attempts,
      // at every poll, for as long as the lock was held.
      await eventually(
        async () => (await statusOf(held)) === 'FAILED',
        'the waiting one failed',
        15_000,
      );
      expect(await t!.outbox.record('inbox_events', held)).toMatchObject({
        attempts: 2,
        lastError: expect.stringMatching(/Query read timeout/),
      });
    } finally {
      await holder.query('ROLLBACK').catch(() => undefined);
      holder.release();
    }
  });

  it('a transaction() a handler left running (not awaited) opens its own once that handler returned, rather than joining the claim and being undone with the next record', async () => {
    let detachedCommitted!: () => void;
    const detached = new Promise<void>((resolve) => (detachedCommitted = resolve));
    @Injectable()
    class Notifier {
      constructor(private readonly outbox: OutboxService) {}
      @InboxHandler({ event: 'PaymentSettled' })
      async handle(event: OutboxEvent<{ n: number }>) {
        if (event.payload.n === 0) {
          // An EventEmitter listener, say, that this handler starts and does not await.
          void (async () => {
            await new Promise((resolve) => setTimeout(resolve, 50));
            await this.outbox.transaction(async (tx) => {
              await tx.query(`INSERT INTO ${prefix}ledger VALUES (0)`);
            });
            detachedCommitted();
          })();
          return;
        }
        // The next record of the batch runs while the listener commits, then fails.
        await detached;
        throw new Error('the next record fails');
      }
    }
    await admin.query(`CREATE TABLE ${prefix}ledger (n int PRIMARY KEY)`);
    const [, next] = await deliverInOneClaim(
      {
        store: () => connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 1,
          },
        },
      },
      [Notifier],
      2,
    );
    await detached;
    await eventually(async () => (await statusOf(next)) === 'FAILED', 'the next one failed');
    // Told it committed: it did. Before, it had joined the claim inside the next record's
    // savepoint and was rolled back with it.
    const { rows } = await admin.query(`SELECT n FROM ${prefix}ledger`);
    expect(rows).toEqual([{ n: 0 }]);
  });

  it('an OutboxService.transaction() inside a processInTransaction handler joins the inbox claim: a failed attempt publishes nothing, the retry exactly once', async () => {
    @Injectable()
    class Emitter {
      calls = 0;
      constructor(private readonly outbox: OutboxService) {}

      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(event: OutboxEvent<{ n: number }>) {
        this.calls++;
        // Not the context's transaction: the service's own, which finds the claim's and joins
        // it. A fresh id per attempt: an attempt's event outside the claim would be published.
        await this.outbox.transaction(async (tx) => {
          tx.publishEvent({
            type: 'ReceiptIssued',
            aggregateType: 'Receipt',
            aggregateId: `r${event.payload.n}-${this.calls}`,
            payload: {},
          });
        });
        if (this.calls === 1) throw new Error('the first attempt fails after emitting');
      }
    }
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: FAST_BOX,
        outboxEvents: FAST_BOX,
      },
      [Emitter],
    );
    const id = await deliver(7);
    await eventually(async () => (await statusOf(id)) === 'COMPLETED', 'the message handled');
    await eventually(
      async () => (await t!.outbox.stats('outbox_events')).pending === 0,
      'every emitted event relayed',
    );
    expect(t.app.get(Emitter).calls).toBe(2);
    expect((await t.outbox.record('inbox_events', id))?.attempts).toBe(2);
    // The first attempt's event went with its rolled-back claim; the retry's was published.
    const published = t.broker
      .peek('events.ReceiptIssued')
      .map((m) => (JSON.parse(m.body.toString()) as { aggregateId: string }).aggregateId);
    expect(published).toEqual(['r7-2']);
  });

  it('a nested transaction whose savepoint fails to release after its work resolved takes its events along', async () => {
    t = await createOutboxTestApp({
      store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
      outboxEvents: FAST_BOX,
    });
    const placed = (aggregateId: string) => ({
      type: 'OrderPlaced',
      aggregateType: 'Order',
      aggregateId,
      payload: {},
    });
    const [kept, undone] = await t.outbox.transaction(async (tx) => {
      const keptId = tx.publishEvent(placed('kept'));
      let undoneId = '';
      await t!.outbox
        .transaction(async (inner) => {
          undoneId = inner.publishEvent(placed('undone'));
          // Caught: PostgreSQL has aborted the savepoint, whose RELEASE then fails after this
          // work resolved, and it is rolled back.
          await inner.query('SELECT 1 / 0').catch(() => undefined);
        })
        .catch(() => undefined);
      return [keptId, undoneId];
    });
    await eventually(
      async () => (await t!.outbox.record('outbox_events', kept))?.status === 'COMPLETED',
      'the kept event published',
    );
    // Before, the nested transaction's event had been handed to the outer one before the
    // savepoint failed, and was published for a rolled-back change.
    expect(await t.outbox.record('outbox_events', undone)).toBeUndefined();
    expect(
      t.broker
        .peek('events.OrderPlaced')
        .map((m) => (JSON.parse(m.body.toString()) as { aggregateId: string }).aggregateId),
    ).toEqual(['kept']);
  });

  it('an inbox batch writing to ordered aggregates never deadlocks with a business transaction', async () => {
    let atGate!: () => void;
    const reachedGate = new Promise<void>((resolve) => (atGate = resolve));
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    /** The batch's first record moves account B; its second waits, then moves account A. */
    @Injectable()
    class Settlements {
      calls = 0;
      @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
      async handle(_event: OutboxEvent, { transaction }: InboxContext) {
        const second = ++this.calls === 2;
        if (second) {
          atGate();
          await gate;
        }
        transaction!.publishEvent({
          type: 'LedgerMoved',
          aggregateType: 'Account',
          aggregateId: second ? 'A' : 'B',
          payload: {},
        });
      }
    }
    const inbox = { ...FAST_BOX, batchSize: 2 };
    const store = () => connectStore(SERVERS.postgres.url, { tablePrefix: prefix });
    // Both messages recorded first (processor off), so that one claim takes them together.
    t = await createOutboxTestApp({ store: store(), inboxEvents: { ...inbox, enabled: false } }, [
      Settlements,
    ]);
    const ids = [await deliver(1), await deliver(2)];
    await eventually(
      async () => (await Promise.all(ids.map(statusOf))).every((s) => s === 'PENDING'),
      'both recorded',
    );
    await t.close();
    t = await createOutboxTestApp(
      {
        store: store(),
        inboxEvents: inbox,
        outboxEvents: { ...FAST_BOX, ordered: true },
      },
      [Settlements],
    );
    await reachedGate; // the first record handled (aggregate B), the second one waiting

    const business = t.outbox.transaction(async (tx) => {
      tx.publishEvent({
        type: 'Transfer',
        aggregateType: 'Account',
        aggregateId: 'A',
        payload: {},
      });
      tx.publishEvent({
        type: 'Transfer',
        aggregateType: 'Account',
        aggregateId: 'B',
        payload: {},
      });
    });
    await new Promise((resolve) => setTimeout(resolve, 200)); // it locks A, and B if it can
    openGate();

    await expect(business).resolves.toBeUndefined();
    await eventually(
      async () => (await Promise.all(ids.map(statusOf))).every((s) => s === 'COMPLETED'),
      'both handled',
    );
    for (const id of ids) {
      expect(await t.outbox.record('inbox_events', id)).toMatchObject({ lastError: null });
    }
  });

  it('an error message with a NUL character still ends FAILED (it is stored without it)', async () => {
    @Injectable()
    class Broken {
      @InboxHandler({ event: 'PaymentSettled' })
      handle(): void {
        throw new Error('bad\u0000byte');
      }
    }
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 2,
          },
        },
      },
      [Broken],
    );
    const id = await deliver(0);
    await eventually(async () => (await statusOf(id)) === 'FAILED', 'failed');
    expect((await t.outbox.record('inbox_events', id))?.lastError).toBe('Error: badbyte');
  });

  it('a header whose name holds a NUL character is left out of the record (PostgreSQL cannot store it), and the message is handled', async () => {
    @Injectable()
    class Settled {
      readonly seen: string[] = [];
      @InboxHandler({ event: 'PaymentSettled' })
      handle(event: OutboxEvent): void {
        this.seen.push(event.id);
      }
    }
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: FAST_BOX,
      },
      [Settled],
    );
    // AMQP allows any bytes in a header name; another program's client may send a NUL.
    const id = await publishInboxEvent(
      t.broker,
      'PaymentSettled',
      { aggregateType: 'Payment', aggregateId: 'p1' },
      { 'trace\u0000id': 'x' },
    );
    await eventually(async () => (await statusOf(id)) === 'COMPLETED', 'handled');
    expect((await t.outbox.record('inbox_events', id))?.headers).not.toHaveProperty(
      'trace\u0000id',
    );
  });

  it('a header holding a lone surrogate, in its value or its name, is left out of the record (PostgreSQL cannot store it), and the message is handled', async () => {
    @Injectable()
    class Settled {
      readonly seen: string[] = [];
      @InboxHandler({ event: 'PaymentSettled' })
      handle(event: OutboxEvent): void {
        this.seen.push(event.id);
      }
    }
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, { tablePrefix: prefix }),
        inboxEvents: FAST_BOX,
      },
      [Settled],
    );
    // JSON keeps a lone surrogate as an escape, which jsonb refuses: the whole record would be.
    const id = await publishInboxEvent(
      t.broker,
      'PaymentSettled',
      { aggregateType: 'Payment', aggregateId: 'p1' },
      { tenant: 'a\ud800b', 'trace\udc00id': 'x', kept: 'yes' },
    );
    await eventually(async () => (await statusOf(id)) === 'COMPLETED', 'handled');
    const { headers } = (await t.outbox.record('inbox_events', id))!;
    expect(headers).not.toHaveProperty('tenant');
    expect(headers).not.toHaveProperty('trace\udc00id');
    expect(headers).toMatchObject({ kept: 'yes' });
  });

  it('a handler that reads through OutboxService on a pool of one connection does not wait forever', async () => {
    @Injectable()
    class Curious {
      seen: Array<string | undefined> = [];
      constructor(private readonly outbox: OutboxService) {}
      @InboxHandler({ event: 'PaymentSettled' })
      async handle(event: OutboxEvent, context: InboxContext) {
        this.seen.push((await this.outbox.record('inbox_events', context.id))?.status);
        await this.outbox.stats('outbox_events');
        void event;
      }
    }
    t = await createOutboxTestApp(
      {
        store: connectStore(SERVERS.postgres.url, {
          tablePrefix: prefix,
          pool: { max: 1 },
        }),
        inboxEvents: FAST_BOX,
      },
      [Curious],
    );
    const id = await deliver(0);
    await eventually(async () => (await statusOf(id)) === 'COMPLETED', 'completed', 10_000);
    // It read its own record inside the claim: still PENDING there.
    expect(t.app.get(Curious).seen).toEqual(['PENDING']);
  });
});
