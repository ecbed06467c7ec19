import type { SweeperOptions } from '../../src/options/module-options';
import {
  InMemoryTransport,
  InvalidHeaderError,
  InvalidOutboxMessageError,
  OutboxTransactionFinishedError,
  PublishRejectedError,
  PublishTimeoutError,
  type InboundMessage,
} from 'nest-sequence';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

const placed = (orderId: string, extra: Record<string, unknown> = {}) => ({
  type: 'OrderPlaced',
  aggregateType: 'Order',
  aggregateId: orderId,
  payload: { orderId, ...extra },
});

const bodies = (messages: readonly InboundMessage[]) =>
  messages.map((message) => JSON.parse(message.body.toString()) as Record<string, unknown>);

describe('Outbox: what a committed transaction publishes (embedded SQLite, in-memory broker)', () => {
  let t: OutboxTestApp;

  afterEach(async () => {
    await t?.close();
  });

  async function start(
    options: Parameters<typeof createOutboxTestApp>[0] = {},
    broker = new InMemoryTransport(),
    /** The purge, when a test runs it. */
    purge?: SweeperOptions,
  ) {
    t = await createOutboxTestApp(
      { outboxEvents: FAST_BOX, outboxCommands: FAST_BOX, ...options },
      [],
      { broker, ...(purge ? { tuning: { sweepers: { purge } } } : {}) },
    );
    await t.outbox.transaction((tx) =>
      tx.query('CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total INTEGER)'),
    );
  }

  const orderCount = () =>
    t.outbox.transaction(
      async (tx) => (await tx.query<{ n: number }>('SELECT count(*) AS n FROM orders')).rows[0].n,
    );

  it('publishes an event recorded in a committed transaction, with its id, kind and type headers', async () => {
    await start();
    const id = await t.outbox.transaction(async (tx) => {
      await tx.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['o-1', 42]);
      return tx.publishEvent(placed('o-1', { total: 42 }), { traceparent: '00-abc-def-01' });
    });

    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'the event published');
    const [message] = t.broker.peek('events.OrderPlaced');
    expect(message.headers).toMatchObject({
      [MESSAGE_ID_HEADER]: id,
      [MESSAGE_KIND_HEADER]: 'event',
      [MESSAGE_TYPE_HEADER]: 'OrderPlaced',
      'content-type': 'application/json',
      traceparent: '00-abc-def-01',
    });
    expect(bodies([message])[0]).toMatchObject({
      id,
      type: 'OrderPlaced',
      aggregateType: 'Order',
      aggregateId: 'o-1',
      payload: { orderId: 'o-1', total: 42 },
    });
    expect(await orderCount()).toBe(1);
    await eventually(
      async () => (await t.outbox.record('outbox_events', id))?.status === 'COMPLETED',
      'the record completed',
    );
  });

  it('publishes nothing, and keeps no business row, when the transaction throws', async () => {
    await start();
    const failure = new Error('business rule broken (expected by the test)');
    await expect(
      t.outbox.transaction(async (tx) => {
        await tx.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['o-2', 1]);
        tx.publishEvent(placed('o-2'));
        tx.sendCommand({ type: 'ShipOrder', targetService: 'shipping', payload: { id: 'o-2' } });
        throw failure;
      }),
    ).rejects.toBe(failure);

    await t.runtime.idle();
    await new Promise((resolve) => setTimeout(resolve, 150)); // more than two polls
    expect(t.broker.peek('events.OrderPlaced')).toEqual([]);
    expect(t.broker.peek('commands.shipping')).toEqual([]);
    expect(await orderCount()).toBe(0);
    expect(await t.outbox.stats('outbox_events')).toEqual({
      pending: 0,
      failed: 0,
      oldestPendingAt: null,
    });
  });

  it('refuses an invalid event where it is recorded, and the transaction rolls back', async () => {
    await start();
    const attempt = t.outbox.transaction(async (tx) => {
      await tx.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['o-3', 1]);
      tx.publishEvent({ type: 'OrderPlaced', aggregateType: 'Order', payload: {} } as never);
    });
    await expect(attempt).rejects.toBeInstanceOf(InvalidOutboxMessageError);
    await expect(attempt).rejects.toMatchObject({ kind: 'event', code: 'invalid-outbox-message' });
    expect(await orderCount()).toBe(0);
  });

  it('refuses an event recorded through a transaction after its work returned; what it committed is published', async () => {
    await start();
    let kept: Parameters<Parameters<typeof t.outbox.transaction>[0]>[0] | undefined;
    const id = await t.outbox.transaction((tx) => {
      kept = tx;
      return Promise.resolve(tx.publishEvent(placed('o-in-time')));
    });

    expect(() => kept?.publishEvent(placed('o-too-late'))).toThrow(OutboxTransactionFinishedError);
    expect(() =>
      kept?.sendCommand({ type: 'ShipOrder', targetService: 'shipping', payload: {} }),
    ).toThrow(OutboxTransactionFinishedError);
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'the event published');
    expect(bodies(t.broker.peek('events.OrderPlaced')).map((b) => b.id)).toEqual([id]);
    expect(t.broker.peek('commands.shipping')).toHaveLength(0);
  });

  it('sends a command to commands.<targetService>', async () => {
    await start();
    const id = await t.outbox.transaction(async (tx) =>
      tx.sendCommand({ type: 'ShipOrder', targetService: 'shipping', payload: { orderId: 'o-4' } }),
    );
    await eventually(() => t.broker.peek('commands.shipping').length === 1, 'the command sent');
    const [message] = t.broker.peek('commands.shipping');
    expect(message.headers[MESSAGE_KIND_HEADER]).toBe('command');
    expect(bodies([message])[0]).toEqual({
      id,
      type: 'ShipOrder',
      targetService: 'shipping',
      payload: { orderId: 'o-4' },
    });
  });

  it('an event routed to several channels reaches each of them', async () => {
    await start({ routes: { event: (event) => [`billing.${event.type}`, `audit.${event.type}`] } });
    await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-5')));
    await eventually(
      () =>
        t.broker.peek('billing.OrderPlaced').length === 1 &&
        t.broker.peek('audit.OrderPlaced').length === 1,
      'both copies published',
    );
  });

  it('a nested transaction that throws is undone alone; the outer one commits', async () => {
    await start();
    await t.outbox.transaction(async (tx) => {
      await tx.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['outer', 1]);
      tx.publishEvent(placed('outer'));
      await t.outbox
        .transaction(async (inner) => {
          await inner.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['inner', 1]);
          inner.publishEvent(placed('inner'));
          throw new Error('inner failure (expected by the test)');
        })
        .catch(() => undefined);
    });
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'one event');
    await t.runtime.idle();
    expect(bodies(t.broker.peek('events.OrderPlaced')).map((b) => b.aggregateId)).toEqual([
      'outer',
    ]);
    expect(await orderCount()).toBe(1);
  });

  it('a savepoint that rolls back takes the events recorded inside it along, whichever transaction recorded them', async () => {
    await start();
    await t.outbox.transaction(async (tx) => {
      tx.publishEvent(placed('kept'));
      await tx
        .savepoint(async () => {
          await tx.query('INSERT INTO orders (id, total) VALUES (?, ?)', ['undone', 1]);
          tx.publishEvent(placed('undone'));
          throw new Error('the savepoint fails (expected by the test)');
        })
        .catch(() => undefined);
      // A nested transaction that records on the outer one, then throws.
      await t.outbox
        .transaction(async () => {
          tx.publishEvent(placed('undone-too'));
          throw new Error('the nested transaction fails (expected by the test)');
        })
        .catch(() => undefined);
    });
    await eventually(() => t.broker.peek('events.OrderPlaced').length >= 1, 'the kept event');
    await t.runtime.idle();
    // Before, both undone events were published: announcements of writes that were rolled back.
    expect(bodies(t.broker.peek('events.OrderPlaced')).map((b) => b.aggregateId)).toEqual(['kept']);
    expect(await orderCount()).toBe(0);
  });

  it("a nested transaction's events are written after those its enclosing transaction recorded before it", async () => {
    await start({ outboxEvents: { ...FAST_BOX, ordered: true } });
    await t.outbox.transaction(async (tx) => {
      tx.publishEvent({ ...placed('A'), type: 'OrderCreated' });
      // A service the caller uses, which opens a transaction of its own: it joins this one.
      await t.outbox.transaction(async (inner) => {
        inner.publishEvent({ ...placed('A'), type: 'OrderPaid' });
      });
      tx.publishEvent({ ...placed('A'), type: 'OrderShipped' });
    });
    const types = () =>
      [
        ...t.broker.peek('events.OrderCreated'),
        ...t.broker.peek('events.OrderPaid'),
        ...t.broker.peek('events.OrderShipped'),
      ].length;
    await eventually(() => types() === 3, 'the three events');
    const rows = await t.outbox.transaction(
      async (tx) =>
        (await tx.query<{ type: string }>('SELECT type FROM outbox_events ORDER BY seq')).rows,
    );
    // Before, the nested transaction wrote its event first, and the relay published OrderPaid
    // ahead of OrderCreated for the same aggregate.
    expect(rows.map((row) => row.type)).toEqual(['OrderCreated', 'OrderPaid', 'OrderShipped']);
  });

  it('retries a publish the broker refused, with backoff, until it is confirmed', async () => {
    await start();
    let refusals = 2;
    t.transport.beforePublish = () => {
      if (refusals-- > 0) throw new PublishRejectedError('events.OrderPlaced', new Error('nack'));
    };
    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-6')));

    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'published at last');
    await eventually(
      async () => (await t.outbox.record('outbox_events', id))?.status === 'COMPLETED',
      'completed',
    );
    const record = await t.outbox.record('outbox_events', id);
    expect(record?.attempts).toBe(3);
    expect(t.transport.attempts).toHaveLength(3);
    expect(t.transport.attempts[1].at - t.transport.attempts[0].at).toBeGreaterThanOrEqual(5);
  });

  it('with retentionMs 0, deletes a record once its publish is confirmed', async () => {
    await start({ outboxEvents: { ...FAST_BOX, retentionMs: 0 } });
    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-del')));

    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'published');
    await eventually(
      async () => (await t.outbox.record('outbox_events', id)) === undefined,
      'the record deleted',
    );
    expect(await t.outbox.stats('outbox_events')).toMatchObject({ pending: 0, failed: 0 });
    expect(t.broker.peek('events.OrderPlaced')[0].headers[MESSAGE_ID_HEADER]).toBe(id);
  });

  it('with retentionMs 0, keeps a refused record PENDING with its attempts, and deletes it once published', async () => {
    await start({ outboxEvents: { ...FAST_BOX, retentionMs: 0 } });
    let refusals = 1;
    t.transport.beforePublish = () => {
      if (refusals-- > 0) throw new PublishRejectedError('events.OrderPlaced', new Error('nack'));
    };
    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-retry')));

    await eventually(
      async () => (await t.outbox.record('outbox_events', id))?.attempts === 1,
      'the refusal counted',
    );
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'published at last');
    await eventually(
      async () => (await t.outbox.record('outbox_events', id)) === undefined,
      'the record deleted',
    );
    expect(t.broker.peek('events.OrderPlaced')).toHaveLength(1);
  });

  it('a message the broker refuses every time is FAILED after maxAttempts; the others keep flowing', async () => {
    await start({
      outboxEvents: {
        ...FAST_BOX,
        retry: {
          ...FAST_BOX.retry,
          attempts: 3,
        },
      },
    });
    t.transport.beforePublish = (attempt) => {
      if (attempt.channel === 'events.Poison') {
        throw new PublishRejectedError(attempt.channel, new Error('nack'));
      }
    };
    const poison = await t.outbox.transaction(async (tx) =>
      tx.publishEvent({ type: 'Poison', aggregateType: 'X', aggregateId: '1', payload: {} }),
    );
    for (let i = 0; i < 5; i++) {
      await t.outbox.transaction(async (tx) => tx.publishEvent(placed(`after-${i}`)));
    }

    await eventually(
      () => t.broker.peek('events.OrderPlaced').length === 5,
      'the others published',
    );
    await eventually(
      async () => (await t.outbox.record('outbox_events', poison))?.status === 'FAILED',
      'the poison message failed',
    );
    const failed = await t.outbox.failed('outbox_events');
    expect(failed.map((record) => [record.id, record.attempts])).toEqual([[poison, 3]]);
    expect(failed[0].lastError).toMatch(/PublishRejectedError/);
    expect(await t.outbox.stats('outbox_events')).toMatchObject({ pending: 0, failed: 1 });

    // An operator fixes the cause and retries it.
    t.transport.beforePublish = () => undefined;
    expect(await t.outbox.retry('outbox_events', [poison])).toBe(1);
    await eventually(() => t.broker.peek('events.Poison').length === 1, 'retried by hand');
  });

  it('a message too large for the broker is FAILED at once, not retried', async () => {
    await start({}, new InMemoryTransport({ maxMessageBytes: 64 * 1024 }));
    const id = await t.outbox.transaction(async (tx) =>
      tx.publishEvent(placed('big', { blob: 'x'.repeat(100 * 1024) })),
    );
    await eventually(
      async () => (await t.outbox.record('outbox_events', id))?.status === 'FAILED',
      'failed',
    );
    const record = await t.outbox.record('outbox_events', id);
    expect(record?.attempts).toBe(1);
    expect(record?.lastError).toMatch(/MessageTooLargeError/);
  });

  it('a route that does not give channel names at once FAILs its record, saying what it gave; a rejected Promise is not left unhandled', async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      await start({
        routes: {
          event: ((event: { type: string }) =>
            event.type === 'Async'
              ? Promise.reject(new Error('no channel yet (expected by the test)'))
              : event.type === 'Nameless'
                ? ['audit', '']
                : [`events.${event.type}`]) as never,
          command: (() => 42) as never,
        },
      });
      const [asyncId, namelessId, commandId, fineId] = await t.outbox.transaction(async (tx) => [
        tx.publishEvent({ ...placed('a'), type: 'Async' }),
        tx.publishEvent({ ...placed('n'), type: 'Nameless' }),
        tx.sendCommand({ type: 'Ship', targetService: 'shipping', payload: {} }),
        tx.publishEvent(placed('fine')),
      ]);
      const failed = async (box: 'outbox_events' | 'outbox_commands', id: string) => {
        const record = await t.outbox.record(box, id);
        return record?.status === 'FAILED' ? record : undefined;
      };
      await eventually(
        async () =>
          (await failed('outbox_events', asyncId)) !== undefined &&
          (await failed('outbox_events', namelessId)) !== undefined &&
          (await failed('outbox_commands', commandId)) !== undefined,
        'the three records failed',
      );
      await new Promise((resolve) => setImmediate(resolve));
      expect((await failed('outbox_events', asyncId))?.lastError).toMatch(
        /route of event Async returned a Promise: a route gives its channel names at once/,
      );
      expect((await failed('outbox_events', namelessId))?.lastError).toMatch(
        /route of event Nameless gave \["audit",""\], not one or more channel names/,
      );
      expect((await failed('outbox_commands', commandId))?.lastError).toMatch(
        /route of command Ship gave 42, not a channel name/,
      );
      await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'the routed one');
      expect(t.broker.peek('audit')).toHaveLength(0);
      expect(unhandled).toEqual([]);
      expect(await t.outbox.record('outbox_events', fineId)).toMatchObject({ status: 'COMPLETED' });
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('a broker outage is not counted as attempts: records stay PENDING, claims wait for the polls, and all are published once it is back', async () => {
    // Two attempts and 10 ms of backoff: counted as attempts, the outage would fail them at once.
    await start({
      outboxEvents: {
        ...FAST_BOX,
        batchSize: 2,
        retry: {
          ...FAST_BOX.retry,
          attempts: 2,
        },
      },
    });
    let down = true;
    let tries = 0;
    t.transport.beforePublish = (attempt) => {
      if (!down) return;
      tries++;
      throw new PublishTimeoutError(attempt.channel, 10, false);
    };
    const ping = t.transport.ping.bind(t.transport);
    let pings = 0;
    t.transport.ping = async () => {
      pings++;
      if (down) throw new Error('not connected to RabbitMQ (reconnecting)');
      return ping();
    };
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push(await t.outbox.transaction(async (tx) => tx.publishEvent(placed(`outage-${i}`))));
    }
    await eventually(() => pings >= 10, 'the relay looking across several polls');
    const pingsBefore = pings;
    await new Promise((resolve) => setTimeout(resolve, 250));
    // Full batches (2 of 5) are not claimed again at once: about one claim per loop and poll
    // (50 ms), not a claim after claim for as long as the outage lasts.
    expect(pings - pingsBefore).toBeLessThan(100);
    // A relay that knows the broker is unreachable publishes nothing: a blocked connection would
    // hold each such publish and deliver it once the alarm clears, a copy per poll.
    expect(tries).toBe(0);
    for (const id of ids) {
      expect(await t.outbox.record('outbox_events', id)).toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    }

    down = false;
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 5, 'all published');
    for (const id of ids) {
      expect(await t.outbox.record('outbox_events', id)).toMatchObject({ status: 'COMPLETED' });
    }
  });

  it('a broker lost during a batch is not counted as attempts either: the batch is released once a publish fails and the health check does too', async () => {
    await start({
      outboxEvents: {
        ...FAST_BOX,
        batchSize: 5,
        retry: {
          ...FAST_BOX.retry,
          attempts: 1,
        },
      },
    });
    // Reachable when the batch starts; the first publish finds the connection gone.
    let down = false;
    let lost = 0;
    t.transport.beforePublish = (attempt) => {
      if (lost > 0 && !down) return;
      lost++;
      down = true;
      throw new PublishTimeoutError(attempt.channel, 10, false);
    };
    const ping = t.transport.ping.bind(t.transport);
    t.transport.ping = async () => {
      if (down) throw new Error('not connected to RabbitMQ (reconnecting)');
      return ping();
    };
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      ids.push(await t.outbox.transaction(async (tx) => tx.publishEvent(placed(`lost-${i}`))));
    }
    await eventually(() => lost === 1, 'a publish of the batch failing');
    await new Promise((resolve) => setTimeout(resolve, 200));
    for (const id of ids) {
      expect(await t.outbox.record('outbox_events', id)).toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    }

    down = false;
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 3, 'all published');
  });

  it('a message whose headers the transport cannot encode is FAILED at once, not retried', async () => {
    await start();
    t.transport.beforePublish = (attempt) => {
      throw new InvalidHeaderError(attempt.channel, 'x-retries', 'is NaN, not a finite number');
    };
    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('unencodable')));
    await eventually(
      async () => (await t.outbox.record('outbox_events', id))?.status === 'FAILED',
      'failed',
    );
    const record = await t.outbox.record('outbox_events', id);
    expect(record?.attempts).toBe(1);
    expect(record?.lastError).toMatch(/InvalidHeaderError.*x-retries is NaN/);
  });

  it('purges completed records past their retention, and keeps failed ones', async () => {
    await start(
      {
        outboxEvents: {
          ...FAST_BOX,
          retentionMs: 1,
          retry: {
            ...FAST_BOX.retry,
            attempts: 1,
          },
        },
      },
      undefined,
      { intervalMs: 50 },
    );
    t.transport.beforePublish = (attempt) => {
      if (attempt.channel === 'events.Refused') {
        throw new PublishRejectedError(attempt.channel, new Error('nack'));
      }
    };
    const [done, failed] = await t.outbox.transaction(async (tx) => [
      tx.publishEvent(placed('kept-briefly')),
      tx.publishEvent({ type: 'Refused', aggregateType: 'X', aggregateId: '1', payload: {} }),
    ]);
    await eventually(() => t.broker.peek('events.OrderPlaced').length === 1, 'published');
    await eventually(
      async () => (await t.outbox.record('outbox_events', done)) === undefined,
      'the completed record purged',
    );
    expect((await t.outbox.record('outbox_events', failed))?.status).toBe('FAILED');
  });

  it('stops a purge of a large backlog between statements when the application shuts down', async () => {
    // A store whose purge statements each take a while, and are counted.
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    const purge = store.purge.bind(store);
    let statements = 0;
    store.purge = async (...args) => {
      statements++;
      await new Promise((resolve) => setTimeout(resolve, 20));
      return purge(...args);
    };
    try {
      await start({ store, outboxEvents: { ...FAST_BOX, retentionMs: 1 } }, undefined, {
        intervalMs: 1_000_000,
        batchSize: 1,
      });
      await t.outbox.transaction(async (tx) => {
        for (let i = 0; i < 200; i++) tx.publishEvent(placed(`o-${i}`));
      });
      await eventually(() => t.broker.peek('events.OrderPlaced').length === 200, 'published');
      await t.runtime.idle();
      const purging = t.runtime.purgeNow();
      await eventually(() => statements > 0, 'the purge started');

      await t.close();
      const after = statements;
      await purging.catch(() => undefined);

      // 200 statements of 20 ms each, had the purge gone on.
      expect(after).toBeLessThan(100);
      expect(statements).toBe(after);
    } finally {
      await store.close();
    }
  });

  it('purges the commands box although the events box keeps its records longer than the epoch is old', async () => {
    await start(
      {
        outboxEvents: { ...FAST_BOX, retentionMs: 1e13 },
        outboxCommands: { ...FAST_BOX, retentionMs: 1 },
      },
      undefined,
      { intervalMs: 50 },
    );
    const [event, command] = await t.outbox.transaction(async (tx) => [
      tx.publishEvent(placed('kept-for-ever')),
      tx.sendCommand({ type: 'ArchiveTask', targetService: 'tasks', payload: {} }),
    ]);
    // Before, the events box's purge threw (a negative completedBefore) and the boxes after it
    // were never purged.
    await eventually(
      async () => (await t.outbox.record('outbox_commands', command)) === undefined,
      'the completed command purged',
    );
    expect(await t.outbox.record('outbox_events', event)).toBeDefined();
  });

  it('with ordered events, a failing event holds back its own aggregate only, and order is kept', async () => {
    await start({ outboxEvents: { ...FAST_BOX, ordered: true } });
    let refuseA1 = 3;
    t.transport.beforePublish = () => undefined;
    const original = t.transport.publish.bind(t.transport);
    t.transport.publish = async (channel, body, headers, options) => {
      const event = JSON.parse(body.toString()) as { aggregateId: string; payload: { n: number } };
      if (event.aggregateId === 'A' && event.payload.n === 1 && refuseA1-- > 0) {
        throw new PublishRejectedError(channel, new Error('nack'));
      }
      return original(channel, body, headers, options);
    };
    for (let n = 1; n <= 3; n++) {
      await t.outbox.transaction(async (tx) => {
        tx.publishEvent({ type: 'Step', aggregateType: 'Agg', aggregateId: 'A', payload: { n } });
        tx.publishEvent({ type: 'Step', aggregateType: 'Agg', aggregateId: 'B', payload: { n } });
      });
    }
    await eventually(() => t.broker.peek('events.Step').length === 6, 'all six published', 10_000);
    const order = bodies(t.broker.peek('events.Step')).map(
      (b) => `${String(b.aggregateId)}${(b.payload as { n: number }).n}`,
    );
    expect(order.filter((s) => s.startsWith('A'))).toEqual(['A1', 'A2', 'A3']);
    expect(order.filter((s) => s.startsWith('B'))).toEqual(['B1', 'B2', 'B3']);
    // B did not wait for A: all of B went out before A's first event made it.
    expect(order.indexOf('B3')).toBeLessThan(order.indexOf('A1'));
  });
});
