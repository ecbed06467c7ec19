import { mkdtempSync, rmSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Injectable, type Type } from '@nestjs/common';
import { Pool } from 'pg';
import {
  HandlerTimeoutError,
  InboxHandler,
  OutboxService,
  type InboxContext,
  type OutboxEvent,
  type OutboxStore,
} from 'nest-sequence';
import { InboxCallEndedError } from 'nest-sequence/ports';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { describeWithServer, SERVERS } from '../support/servers';
import { postgresPool } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import {
  createOutboxTestApp,
  FAST_BOX,
  publishInboxEvent,
  type OutboxTestApp,
} from './outbox-test-app';

/**
 * Past `handlerTimeoutMs`, `context.transaction` refuses every later statement of that call: a
 * savepoint the handler opened before its limit and whose work ends after it sends nothing more.
 * (Its `RELEASE` would fail, the savepoint being gone with the call's writes, and abort the
 * claim's transaction in the middle of the next record's handler.) The same once a call threw or
 * returned: what it left running would otherwise land in the next record's savepoint and commit
 * with the claim.
 */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const BOXES = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];

/** An inbox event of `type` with payload `{ n }`, once the inbox has recorded it; gives its id. */
async function deliverTo(t: OutboxTestApp, type: string, n: number): Promise<string> {
  const id = await publishInboxEvent(t.broker, type, {
    aggregateType: 'Payment',
    aggregateId: `p${n}`,
    payload: { n },
  });
  await eventually(
    async () => (await t.outbox.record('inbox_events', id))?.status === 'PENDING',
    `message ${n} recorded`,
  );
  return id;
}

/** The scenario, on stores `open()` makes (each call a new store on the same database). */
function timedOutSavepointCase(open: () => Promise<OutboxStore>): void {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const deliver = (type: string, n: number) => deliverTo(t!, type, n);

  it.each(['Slow', 'SlowJoined'])(
    'lets the record claimed after a timed-out one (%s) complete at its first attempt',
    async (slowType) => {
      let healthyCalls = 0;
      @Injectable()
      class Handlers {
        constructor(private readonly outbox: OutboxService) {}

        // Each opens a savepoint before its limit that ends after it (ignoring the signal, as
        // plenty of code does): its own, or by joining outbox.transaction().
        @InboxHandler({ event: 'Slow', processInTransaction: true, handlerTimeoutMs: 100 })
        async slow(_event: OutboxEvent, { transaction }: InboxContext) {
          await transaction!.savepoint(() => sleep(300));
        }

        @InboxHandler({ event: 'SlowJoined', processInTransaction: true, handlerTimeoutMs: 100 })
        async slowJoined() {
          await this.outbox.transaction(() => sleep(300));
        }

        @InboxHandler({ event: 'Healthy', processInTransaction: true })
        async healthy(_event: OutboxEvent, { transaction }: InboxContext) {
          healthyCalls++;
          await transaction!.query('SELECT 1');
          await sleep(500); // still running when the abandoned call's savepoint ends
        }
      }
      const inboxEvents = { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 5 } };
      // Both recorded while no processor runs, so that one claim takes them together.
      t = await createOutboxTestApp(
        { store: await open(), inboxEvents: { ...inboxEvents, enabled: false } },
        [Handlers],
      );
      await deliver(slowType, 1);
      const healthy = await deliver('Healthy', 2);
      await t.close();
      t = await createOutboxTestApp({ store: await open(), inboxEvents }, [Handlers]);

      await eventually(
        async () => (await t!.outbox.record('inbox_events', healthy))?.status === 'COMPLETED',
        'the healthy one handled',
        10_000,
      );
      const record = await t.outbox.record('inbox_events', healthy);
      expect({
        attempts: record?.attempts,
        lastError: record?.lastError,
        calls: healthyCalls,
      }).toEqual({ attempts: 1, lastError: null, calls: 1 });
    },
  );
}

/** Writes a handler's call left running when it ended, on stores `open()` makes: none commits. */
function strayWritesCase(open: () => Promise<OutboxStore>, ledger: () => string): void {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  /** The ids of the records of the last `inOneClaim`, in the order of its `types`. */
  let ids: string[] = [];
  const write = (transaction: { query(sql: string): Promise<unknown> }, n: number, at: number) =>
    transaction.query(`INSERT INTO ${ledger()} (n, attempt) VALUES (${n}, ${at})`);

  /** Runs `types` in one claim (recorded while no processor ran); gives the ledger's rows. */
  async function inOneClaim(handlers: Type, types: string[], attempts = 5) {
    const inboxEvents = { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts } };
    t = await createOutboxTestApp(
      { store: await open(), inboxEvents: { ...inboxEvents, enabled: false } },
      [handlers],
    );
    await t.app.get(OutboxService).transaction(async (tx) => {
      await tx.query(`CREATE TABLE IF NOT EXISTS ${ledger()} (n integer, attempt integer)`);
    });
    ids = [];
    for (const [n, type] of types.entries()) ids.push(await deliverTo(t, type, n));
    await t.close();
    t = await createOutboxTestApp({ store: await open(), inboxEvents }, [handlers]);
    await eventually(
      async () => {
        for (const id of ids) {
          const status = (await t!.outbox.record('inbox_events', id))?.status;
          if (status !== 'COMPLETED' && status !== 'FAILED') return false;
        }
        return true;
      },
      'every record settled',
      10_000,
    );
    await sleep(400); // what the calls left running has run by now
    return t.app.get(OutboxService).transaction(async (tx) => {
      const { rows } = await tx.query(`SELECT n, attempt FROM ${ledger()} ORDER BY n, attempt`);
      return rows.map((row) => ({ n: Number(row.n), attempt: Number(row.attempt) }));
    });
  }

  it('commits no write a call started before it threw', async () => {
    @Injectable()
    class Handlers {
      @InboxHandler({ event: 'Capture', processInTransaction: true })
      async capture(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        if (attempt === 1) {
          // The ledger write and the payment provider's call side by side; the provider fails.
          await Promise.all([
            sleep(30).then(() => write(transaction!, event.payload.n, attempt)),
            sleep(5).then(() => Promise.reject(new Error('declined'))),
          ]);
        }
        await write(transaction!, event.payload.n, attempt);
      }

      @InboxHandler({ event: 'Next', processInTransaction: true })
      async next(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        await sleep(200); // the claim is still on this record when the stray write comes
        await write(transaction!, event.payload.n, attempt);
      }
    }
    expect(await inOneClaim(Handlers, ['Capture', 'Next'])).toEqual([
      { n: 0, attempt: 2 },
      { n: 1, attempt: 1 },
    ]);
  });

  it.each([
    ['threw', 'Declined', InboxCallEndedError],
    ['ran past its time limit', 'Slow', HandlerTimeoutError],
  ])(
    'refuses a transaction() that a call which %s left running starts after the retry',
    async (_ended, type, refusal) => {
      const late: unknown[] = [];
      let handledAgain!: () => void;
      const retried = new Promise<void>((resolve) => (handledAgain = resolve));
      @Injectable()
      class Handlers {
        constructor(private readonly outbox: OutboxService) {}

        async writeOnce(n: number, attempt: number, end: () => Promise<void>) {
          if (attempt === 1) {
            // A listener it starts and does not await, which writes once the record was retried.
            void retried
              .then(() => sleep(100))
              .then(() => this.outbox.transaction((tx) => write(tx, n, attempt)))
              .catch((error: unknown) => late.push(error));
            return end();
          }
          await this.outbox.transaction((tx) => write(tx, n, attempt));
          setTimeout(handledAgain, 100); // once this claim committed
        }

        @InboxHandler({ event: 'Declined', processInTransaction: true })
        async declined(event: OutboxEvent<{ n: number }>, { attempt }: InboxContext) {
          await this.writeOnce(event.payload.n, attempt, () =>
            Promise.reject(new Error('declined')),
          );
        }

        @InboxHandler({ event: 'Slow', processInTransaction: true, handlerTimeoutMs: 100 })
        async slow(event: OutboxEvent<{ n: number }>, { attempt }: InboxContext) {
          await this.writeOnce(event.payload.n, attempt, () => sleep(200).then(() => undefined));
        }
      }
      expect(await inOneClaim(Handlers, [type])).toEqual([{ n: 0, attempt: 2 }]);
      expect(late).toEqual([expect.any(refusal)]);
    },
  );

  it('commits no write of a transaction() joined by a call past its time limit', async () => {
    @Injectable()
    class Handlers {
      constructor(private readonly outbox: OutboxService) {}

      @InboxHandler({ event: 'Slow', processInTransaction: true, handlerTimeoutMs: 100 })
      async slow(event: OutboxEvent<{ n: number }>, { attempt }: InboxContext) {
        await this.outbox.transaction(async (tx) => {
          await sleep(200);
          await write(tx, event.payload.n, attempt);
        });
      }

      @InboxHandler({ event: 'Next', processInTransaction: true })
      async next(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        await sleep(500);
        await write(transaction!, event.payload.n, attempt);
      }
    }
    expect(await inOneClaim(Handlers, ['Slow', 'Next'], 1)).toEqual([{ n: 1, attempt: 1 }]);
  });

  it('refuses a statement after the call returned with InboxCallEndedError', async () => {
    const late: unknown[] = [];
    @Injectable()
    class Handlers {
      @InboxHandler({ event: 'Careless', processInTransaction: true })
      careless(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        // Not awaited: it comes after the handler returned.
        void sleep(30)
          .then(() => write(transaction!, event.payload.n, attempt))
          .catch((error: unknown) => late.push(error));
        return Promise.resolve();
      }

      @InboxHandler({ event: 'Next', processInTransaction: true })
      async next(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        await sleep(200);
        await write(transaction!, event.payload.n, attempt);
      }
    }
    expect(await inOneClaim(Handlers, ['Careless', 'Next'])).toEqual([{ n: 1, attempt: 1 }]);
    expect(late).toEqual([expect.any(InboxCallEndedError)]);
    expect((late[0] as InboxCallEndedError).ended).toBe('completed');
  });

  // On SQLite such a transaction() opens its savepoint inside the call's, whose release is then
  // refused (savepoints of one SQLite transaction must nest): each attempt of the call fails, and
  // its savepoint is rolled back with the one left open inside it.
  it('refuses a statement of a transaction() joined by a call that returned before it', async () => {
    const late: unknown[] = [];
    @Injectable()
    class Handlers {
      constructor(private readonly outbox: OutboxService) {}

      @InboxHandler({ event: 'Careless', processInTransaction: true })
      careless(event: OutboxEvent<{ n: number }>, { attempt }: InboxContext) {
        // Joined while the call runs, written after it returned.
        void this.outbox
          .transaction(async (tx) => {
            await sleep(30);
            await write(tx, event.payload.n, attempt);
          })
          .catch((error: unknown) => late.push(error));
        return Promise.resolve();
      }

      @InboxHandler({ event: 'Next', processInTransaction: true })
      async next(event: OutboxEvent<{ n: number }>, { transaction, attempt }: InboxContext) {
        await sleep(200);
        await write(transaction!, event.payload.n, attempt);
      }
    }
    expect(await inOneClaim(Handlers, ['Careless', 'Next'])).toEqual([{ n: 1, attempt: 1 }]);
    // Each call returned with its transaction() still open: refused, and retried until FAILED.
    const careless = await t!.outbox.record('inbox_events', ids[0]);
    expect({ status: careless?.status, lastError: careless?.lastError }).toEqual({
      status: 'FAILED',
      lastError: expect.stringMatching(/^NestedTransactionOpenError: /),
    });
    expect(late).toHaveLength(5);
  });
}

describeWithServer(
  'postgres',
  'inbox on PostgreSQL: a timed-out handler whose savepoint ends late',
  () => {
    let admin: Pool;
    let prefix: string;
    const stores: PostgresOutboxStore[] = [];
    beforeAll(() => {
      admin = postgresPool({ max: 2 });
    });
    beforeEach(() => {
      prefix = `sp${randomUUID().replace(/-/g, '').slice(0, 10)}_`;
    });
    afterEach(async () => {
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
      for (const table of [...BOXES, 'outbox_migrations', 'ledger']) {
        await admin.query(`DROP TABLE IF EXISTS ${prefix}${table}`);
      }
    });
    afterAll(async () => {
      await admin.end();
    });

    const open = async () => {
      const store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: prefix });
      stores.push(store);
      return store;
    };
    timedOutSavepointCase(open);
    describe('writes a call left running when it ended', () => {
      strayWritesCase(open, () => `${prefix}ledger`);
    });
  },
);

describe('inbox on SQLite: a timed-out handler whose savepoint ends late', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'nseq-sqlite-savepoint-'));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  const open = () => SqliteOutboxStore.open({ filename: join(dir, 'outbox.db') });
  timedOutSavepointCase(open);
  describe('writes a call left running when it ended', () => {
    strayWritesCase(open, () => 'ledger');
  });
});
