import { mkdtempSync, rmSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Injectable } from '@nestjs/common';
import { Pool } from 'pg';
import {
  InboxHandler,
  OutboxService,
  type InboxContext,
  type OutboxEvent,
  type OutboxStore,
} from 'nest-sequence';
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
 * claim's transaction in the middle of the next record's handler.)
 */
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const BOXES = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];

/** The scenario, on stores `open()` makes (each call a new store on the same database). */
function timedOutSavepointCase(open: () => Promise<OutboxStore>): void {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  async function deliver(type: string, n: number): Promise<string> {
    const id = await publishInboxEvent(t!.broker, type, {
      aggregateType: 'Payment',
      aggregateId: `p${n}`,
      payload: { n },
    });
    await eventually(
      async () => (await t!.outbox.record('inbox_events', id))?.status === 'PENDING',
      `message ${n} recorded`,
    );
    return id;
  }

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
      for (const table of [...BOXES, 'outbox_migrations']) {
        await admin.query(`DROP TABLE IF EXISTS ${prefix}${table}`);
      }
    });
    afterAll(async () => {
      await admin.end();
    });

    timedOutSavepointCase(async () => {
      const store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: prefix });
      stores.push(store);
      return store;
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

  timedOutSavepointCase(() => SqliteOutboxStore.open({ filename: join(dir, 'outbox.db') }));
});
