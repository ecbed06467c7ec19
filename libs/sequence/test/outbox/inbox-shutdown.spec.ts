import { randomUUID } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { InboxHandler, type InboxContext, type OutboxEvent } from 'nest-sequence';
import { ShutdownTimeoutError } from 'nest-sequence/ports';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { describeWithServer, SERVERS } from '../support/servers';
import { usePostgres } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

const SHUTDOWN_TIMEOUT_MS = 300;

describeWithServer('postgres', 'Inbox: a handler still running at shutdown (PostgreSQL)', () => {
  const stores: PostgresOutboxStore[] = [];
  let t: OutboxTestApp | undefined;
  const pg = usePostgres({
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    },
  });

  it('is abandoned after shutdownTimeoutMs: the app closes, its record stays due, uncounted, and the claim commits what was handled before it', async () => {
    const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
      tablePrefix: pg.tablePrefix,
    });
    stores.push(store);
    // Received before the app starts: its processor's first claim takes both, in this order.
    await store.migrate();
    const record = (aggregateId: string) => {
      const id = randomUUID();
      const event = { id, type: 'TaskCreated', aggregateType: 'Task', aggregateId, payload: {} };
      return {
        id,
        kind: 'event' as const,
        type: 'TaskCreated',
        partitionKey: JSON.stringify(['Task', aggregateId]),
        body: JSON.stringify({ ...event, occurredAt: new Date().toISOString() }),
        headers: {},
      };
    };
    const done = record('done');
    const stuck = record('stuck');
    for (const each of [done, stuck]) await store.receive('inbox_events', each);

    const reasons: unknown[] = [];
    const calls: string[] = [];
    @Injectable()
    class Tasks {
      // No handlerTimeoutMs: nothing but the shutdown bounds the call.
      @InboxHandler({ event: 'TaskCreated', processInTransaction: true })
      async handle(event: OutboxEvent, { signal }: InboxContext): Promise<void> {
        calls.push(event.aggregateId);
        if (event.aggregateId !== 'stuck') return;
        signal.addEventListener('abort', () => reasons.push(signal.reason));
        await new Promise<void>(() => undefined); // an HTTP call without a timeout, say
      }
    }
    t = await createOutboxTestApp({ store, inboxEvents: FAST_BOX }, [Tasks], {
      shutdownTimeoutMs: SHUTDOWN_TIMEOUT_MS,
    });
    await eventually(() => calls.length === 2, 'the stuck call');
    expect(calls).toEqual(['done', 'stuck']);

    const closing = Date.now();
    const closed = await Promise.race([
      t.close().then(() => true),
      new Promise<false>((resolve) => setTimeout(() => resolve(false), 10_000)),
    ]);
    t = undefined;

    expect(closed).toBe(true);
    expect(Date.now() - closing).toBeLessThan(SHUTDOWN_TIMEOUT_MS + 5_000);
    expect(reasons).toEqual([expect.any(ShutdownTimeoutError)]);
    expect(await store.get('inbox_events', stuck.id)).toMatchObject({
      status: 'PENDING',
      attempts: 0,
    });
    expect((await store.get('inbox_events', done.id))?.status).toBe('COMPLETED');
  });
});
