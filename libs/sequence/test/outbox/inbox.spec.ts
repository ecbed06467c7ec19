import { randomUUID } from 'node:crypto';
import { Injectable, Module, type OnModuleDestroy } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import {
  InboxHandler,
  InMemoryTransport,
  OutboxService,
  SequenceModule,
  SequenceOptionsError,
  type OutboxStore,
} from 'nest-sequence';
import {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  REQUEUE_COUNT_HEADER,
  type HeaderMap,
} from 'nest-sequence/wire';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import {
  ClosingDatabase,
  ClosingDatabaseModule,
  heldHandlerProbe,
} from '../support/closing-dependency';
import { overrideMethods } from '../support/override-methods';
import { deadLetters, deathReasonOf, eventually } from '../support/sequence-test-app';
import type { InboxReceiver } from '../../src/outbox/inbox.receiver';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  type OutboxTestApp,
  type RecordingInboxHandler,
} from './outbox-test-app';

const TaskCreated = inboxHandler({ event: 'TaskCreated' });
const TaskCreatedInTransaction = inboxHandler({ event: 'TaskCreated', processInTransaction: true });
const ArchiveTask = inboxHandler({ command: 'ArchiveTask' });

/** A TaskCreated event as another service's relay would publish it. */
function taskCreated(
  id: string = randomUUID(),
  taskId = 't-1',
): { body: Buffer; headers: HeaderMap } {
  const event = {
    id,
    type: 'TaskCreated',
    aggregateType: 'Task',
    aggregateId: taskId,
    payload: { taskId, title: 'write docs' },
    occurredAt: new Date().toISOString(),
  };
  return {
    body: Buffer.from(JSON.stringify(event)),
    headers: {
      [MESSAGE_ID_HEADER]: id,
      [MESSAGE_KIND_HEADER]: 'event',
      [MESSAGE_TYPE_HEADER]: 'TaskCreated',
      'content-type': 'application/json',
    },
  };
}

describe('Inbox: each message handled once per id (embedded SQLite, in-memory broker)', () => {
  let t: OutboxTestApp;
  /** Adapters a test passed in: the module leaves them to their owner. */
  const owned: { close(): Promise<void> | void }[] = [];

  afterEach(async () => {
    await t?.close();
    for (const adapter of owned.splice(0)) await adapter.close();
  });

  const inboxOptions = { inboxEvents: FAST_BOX, inboxCommands: FAST_BOX, outboxEvents: FAST_BOX };

  async function deliver(
    message: { body: Buffer; headers: HeaderMap },
    channel = 'events.TaskCreated',
  ) {
    await t.broker.publish(channel, message.body, message.headers);
  }

  it('runs the handler once for a message delivered three times', async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreated]);
    const handler = t.handler(TaskCreated);
    const message = taskCreated();
    for (let i = 0; i < 3; i++) await deliver(message);
    await deliver(taskCreated());

    await eventually(() => handler.calls.length === 2, 'both messages handled');
    await t.broker.whenIdle();
    await t.runtime.idle();
    await new Promise((resolve) => setTimeout(resolve, 120));
    expect([...handler.callsPerId().values()]).toEqual([1, 1]);
    expect(t.broker.peek('events.TaskCreated')).toEqual([]); // every copy acked
    expect(handler.calls[0]).toMatchObject({ attempt: 1, inTransaction: false });
  });

  it("keeps a message's string headers, not those RabbitMQ adds to a dead-lettered message replayed from its queue", async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreated]);
    const message = taskCreated();
    await deliver({
      body: message.body,
      headers: {
        ...message.headers,
        traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
        'x-first-death-queue': 'events.TaskCreated',
        'x-first-death-reason': 'rejected',
        'x-first-death-exchange': '',
        'x-last-death-queue': 'events.TaskCreated',
        'x-last-death-reason': 'rejected',
        'x-last-death-exchange': '',
        'x-death-reason': 'handler-failed: gave up',
        [REQUEUE_COUNT_HEADER]: 3,
      },
    });
    const id = String(message.headers[MESSAGE_ID_HEADER]);
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'COMPLETED',
      'handled',
    );
    expect((await t.outbox.record('inbox_events', id))?.headers).toEqual({
      ...message.headers,
      traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
    });
  });

  it('lets a handler in progress finish before deeper modules are destroyed', async () => {
    const probe = heldHandlerProbe();
    @Injectable()
    class Tasks {
      constructor(private readonly database: ClosingDatabase) {}
      @InboxHandler({ event: 'TaskCreated' })
      async created(): Promise<void> {
        await probe.use(this.database);
      }
    }
    @Module({ imports: [ClosingDatabaseModule], providers: [Tasks] })
    class TasksModule {}
    const broker = new InMemoryTransport();
    owned.push(broker);
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport: broker,
          outbox: inboxOptions,
          tuning: { sweepers: { expiry: { intervalMs: false } } },
        }),
        TasksModule,
      ],
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();
    const message = taskCreated();
    await broker.publish('events.TaskCreated', message.body, message.headers);
    await eventually(() => probe.seen.length === 1, 'the handler running');

    await probe.closeWhileHandling(app);

    expect(probe.seen).toEqual([false, false]);
  });

  it('relays what a module records while it is destroyed: the relays run until beforeApplicationShutdown', async () => {
    /** Deeper than SequenceModule: destroyed after it. */
    @Injectable()
    class Audit implements OnModuleDestroy {
      constructor(private readonly modules: ModuleRef) {}
      async onModuleDestroy(): Promise<void> {
        await this.modules.get(OutboxService, { strict: false }).transaction(async (tx) => {
          tx.publishEvent({
            type: 'ServiceStopped',
            aggregateType: 'Service',
            aggregateId: 'a',
            payload: {},
          });
        });
      }
    }
    @Module({ providers: [Audit] })
    class AuditModule {}
    @Module({ imports: [AuditModule] })
    class FeatureModule {}
    const broker = new InMemoryTransport();
    owned.push(broker);
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport: broker,
          outbox: { outboxEvents: FAST_BOX },
          tuning: { sweepers: { expiry: { intervalMs: false } } },
        }),
        FeatureModule,
      ],
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();

    await app.close();

    expect(broker.peek('events.ServiceStopped')).toHaveLength(1);
  });

  it('drops a duplicate inside the retention window; once the id is purged, the same id is handled again', async () => {
    t = await createOutboxTestApp(
      { ...inboxOptions, inboxEvents: { ...FAST_BOX, retentionMs: 3_000 } },
      [TaskCreated],
      { tuning: { sweepers: { purge: { intervalMs: 50 } } } },
    );
    const handler = t.handler(TaskCreated);
    const id = randomUUID();
    const message = taskCreated(id);
    await deliver(message);
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'COMPLETED',
      'the first copy handled and marked',
    );

    await deliver(message); // inside the window: recognised by its id
    await t.broker.whenIdle();
    await t.runtime.idle();
    expect(handler.calls).toHaveLength(1);
    expect(await t.outbox.record('inbox_events', id)).toBeDefined();

    await eventually(
      async () => (await t.outbox.record('inbox_events', id)) === undefined,
      'the id purged after retentionMs',
    );
    await deliver(message); // past the window: nothing remembers it
    await eventually(() => handler.calls.length === 2, 'handled again once forgotten');
    expect([...handler.callsPerId().values()]).toEqual([2]);
  });

  it('inbox table not writable: the message is requeued, never acked unrecorded, and handled once it is; after tuning.maxStoreRequeues requeues it is dead-lettered store-unavailable', async () => {
    const state = { failing: true };
    const sqlite = await SqliteOutboxStore.open({ filename: ':memory:' });
    owned.push(sqlite);
    const store = overrideMethods<OutboxStore>(sqlite, {
      receive: (...args) =>
        state.failing
          ? Promise.reject(new Error('simulated: the database refuses writes'))
          : sqlite.receive(...args),
    });
    t = await createOutboxTestApp({ ...inboxOptions, store }, [TaskCreated], {
      tuning: { maxStoreRequeues: 20, backpressureDelayMs: 100 },
    });
    const handler = t.handler(TaskCreated);

    const first = taskCreated();
    await deliver(first);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(handler.calls).toHaveLength(0);
    expect(deadLetters(t.broker, 'events.TaskCreated')).toEqual([]);
    state.failing = false;
    // Requeued after backpressureDelayMs, behind the others: then recorded and handled.
    await eventually(() => handler.calls.length === 1, 'handled once the store writes again');

    state.failing = true;
    // After 19 requeues it is requeued once more; after 20 it goes.
    const almost = taskCreated();
    await deliver({ ...almost, headers: { ...almost.headers, [REQUEUE_COUNT_HEADER]: 19 } });
    const last = taskCreated();
    await deliver({ ...last, headers: { ...last.headers, [REQUEUE_COUNT_HEADER]: 20 } });
    await eventually(
      () => deadLetters(t.broker, 'events.TaskCreated').length === 1,
      'dead-lettered after 20 requeues',
    );
    const lastId = JSON.parse(last.body.toString()).id as string;
    expect(deathReasonOf(deadLetters(t.broker, 'events.TaskCreated')[0])).toMatch(
      new RegExp(
        `^store-unavailable: inbox inbox_events could not record ${lastId} after 20 requeues ` +
          'of the message \\(tuning.maxStoreRequeues is 20\\), ' +
          'last: simulated: the database refuses writes; publish the message again',
      ),
    );
    expect(handler.calls).toHaveLength(1);
    // The one at 19 was requeued instead; it goes on its next try, with its count at 20.
    const almostId = JSON.parse(almost.body.toString()).id as string;
    await eventually(
      () => deadLetters(t.broker, 'events.TaskCreated').length === 2,
      'the other one dead-lettered a requeue later',
    );
    expect(
      deadLetters(t.broker, 'events.TaskCreated').map((message) => [
        message.headers[MESSAGE_ID_HEADER],
        message.headers[REQUEUE_COUNT_HEADER],
      ]),
    ).toEqual([
      // Dead letters leave the transport's count behind: republished, a message starts afresh.
      [lastId, undefined],
      [almostId, undefined],
    ]);
  });

  it('with processInTransaction, what the handler writes commits with the inbox mark', async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreatedInTransaction]);
    await t.outbox.transaction((tx) => tx.query('CREATE TABLE tasks (id TEXT PRIMARY KEY)'));
    const handler = t.handler(TaskCreatedInTransaction);
    let failuresLeft = 2;
    handler.onCall = async (message, { transaction }) => {
      await transaction!.query('INSERT INTO tasks (id) VALUES (?)', [
        (message.payload as { taskId: string }).taskId,
      ]);
      if (failuresLeft-- > 0) throw new Error('handler failure after its write (expected)');
    };
    const message = taskCreated(randomUUID(), 'task-9');
    await deliver(message);

    await eventually(() => handler.calls.length === 3, 'two failures, then a success');
    const id = JSON.parse(message.body.toString()).id as string;
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'COMPLETED',
      'marked done',
    );
    expect(handler.calls.map((call) => [call.attempt, call.inTransaction])).toEqual([
      [1, true],
      [2, true],
      [3, true],
    ]);
    // The two failed attempts' inserts were rolled back: one row, not a primary key clash.
    const rows = await t.outbox.transaction(
      async (tx) => (await tx.query<{ id: string }>('SELECT id FROM tasks')).rows,
    );
    expect(rows).toEqual([{ id: 'task-9' }]);
  });

  it("when writing the batch's recorded events fails, every handler's writes are undone and each record counts a failed attempt", async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    owned.push(store);
    t = await createOutboxTestApp({ ...inboxOptions, store }, [TaskCreatedInTransaction]);
    await t.outbox.transaction((tx) => tx.query('CREATE TABLE tasks (id TEXT PRIMARY KEY)'));
    const handler = t.handler(TaskCreatedInTransaction);
    handler.onCall = async (message, { transaction }) => {
      const { taskId } = message.payload as { taskId: string };
      await transaction!.query('INSERT INTO tasks (id) VALUES (?)', [taskId]);
      transaction!.publishEvent({
        type: 'TaskIndexed',
        aggregateType: 'Task',
        aggregateId: taskId,
        payload: {},
      });
    };
    // The batch's one write of recorded events fails once (a lock timeout, say).
    const append = store.append.bind(store);
    let failuresLeft = 1;
    store.append = async (box, records, within) => {
      if (box === 'outbox_events' && failuresLeft-- > 0) throw new Error('lock timeout (injected)');
      return append(box, records, within);
    };
    const message = taskCreated(randomUUID(), 'task-7');
    await deliver(message);

    const id = JSON.parse(message.body.toString()).id as string;
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'COMPLETED',
      'handled on the second attempt',
    );
    expect(handler.calls.map((call) => call.attempt)).toEqual([1, 2]);
    expect(await t.outbox.record('inbox_events', id)).toMatchObject({
      attempts: 2,
      lastError: expect.stringContaining('lock timeout (injected)'),
    });
    // The first attempt's insert was undone with the failed write: one row, and one event.
    const rows = await t.outbox.transaction(
      async (tx) => (await tx.query<{ id: string }>('SELECT id FROM tasks')).rows,
    );
    expect(rows).toEqual([{ id: 'task-7' }]);
    await eventually(() => t.broker.peek('events.TaskIndexed').length === 1, 'the event relayed');
  });

  it('a handler that keeps failing leaves the record FAILED after maxAttempts, with the error', async () => {
    t = await createOutboxTestApp(
      {
        ...inboxOptions,
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 2,
          },
        },
      },
      [TaskCreated],
    );
    const handler = t.handler(TaskCreated);
    handler.onCall = () => {
      throw new Error('downstream is down (expected)');
    };
    const message = taskCreated();
    await deliver(message);
    const id = JSON.parse(message.body.toString()).id as string;
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'FAILED',
      'failed',
    );
    expect(handler.calls).toHaveLength(2);
    expect((await t.outbox.record('inbox_events', id))?.lastError).toMatch(/downstream is down/);
    // A redelivery of the same id is still a duplicate: it does not run the handler again.
    await deliver(message);
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(handler.calls).toHaveLength(2);
  });

  it('dead-letters a message that is not a valid event, naming the problem', async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreated]);
    const good = taskCreated();
    const noAggregate = JSON.parse(good.body.toString()) as Record<string, unknown>;
    delete noAggregate.aggregateId;
    await deliver({ body: Buffer.from(JSON.stringify(noAggregate)), headers: good.headers });
    await deliver({ body: Buffer.from('not json'), headers: good.headers });
    await deliver({ body: good.body, headers: { ...good.headers, [MESSAGE_KIND_HEADER]: 'fact' } });

    await eventually(
      () => deadLetters(t.broker, 'events.TaskCreated').length === 3,
      'three dead letters',
    );
    const reasons = deadLetters(t.broker, 'events.TaskCreated').map(deathReasonOf);
    expect(reasons[0]).toMatch(/^invalid-inbox-message: .*aggregateId/);
    expect(reasons[1]).toMatch(/^invalid-inbox-message: .*not JSON/);
    expect(reasons[2]).toMatch(/^invalid-inbox-message: .*x-message-kind/);
    expect(t.handler(TaskCreated).calls).toEqual([]);
  });

  it('dead-letters a message with no headers at all instead of throwing', async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreated]);
    // The receiver as a subscriber of your own would call it: headers as amqplib reports none.
    const receiver = (t.runtime as unknown as { receiver: InboxReceiver }).receiver;
    const disposition = await receiver.receive({
      channel: 'events.TaskCreated',
      body: taskCreated().body,
      headers: undefined as unknown as HeaderMap,
      redelivered: false,
    });

    expect(disposition).toEqual({
      action: 'dead-letter',
      reason: expect.stringMatching(/^invalid-inbox-message: .*x-message-kind/) as string,
    });
  });

  it('dead-letters a message whose type no handler takes', async () => {
    t = await createOutboxTestApp({ ...inboxOptions, serviceName: 'tasks' }, [ArchiveTask]);
    const command = {
      id: randomUUID(),
      type: 'DeleteEverything',
      targetService: 'tasks',
      payload: {},
    };
    await deliver(
      {
        body: Buffer.from(JSON.stringify(command)),
        headers: { [MESSAGE_KIND_HEADER]: 'command', [MESSAGE_ID_HEADER]: command.id },
      },
      'commands.tasks',
    );
    await eventually(() => deadLetters(t.broker, 'commands.tasks').length === 1, 'dead-lettered');
    expect(deathReasonOf(deadLetters(t.broker, 'commands.tasks')[0])).toMatch(
      /^no-inbox-handler: .*DeleteEverything/,
    );
  });

  it('a command handler needs the service name (its channel is commands.<serviceName>)', async () => {
    await expect(createOutboxTestApp(inboxOptions, [ArchiveTask])).rejects.toThrow(
      SequenceOptionsError,
    );
    await expect(createOutboxTestApp(inboxOptions, [ArchiveTask])).rejects.toThrow(/serviceName/);
  });

  it('refuses a processInTransaction that is not a boolean rather than run outside the transaction', async () => {
    // 'true' from a config file: taken as false, the handler's writes would not commit with the mark.
    const FromConfig = inboxHandler({
      event: 'TaskCreated',
      processInTransaction: 'true' as never,
    });
    const failure = createOutboxTestApp(inboxOptions, [FromConfig]);
    await expect(failure).rejects.toThrow(SequenceOptionsError);
    await expect(failure).rejects.toThrow(/processInTransaction must be true or false, got "true"/);
  });

  it('end to end in one app: a committed command reaches its inbox handler once', async () => {
    t = await createOutboxTestApp({ ...inboxOptions, serviceName: 'tasks' }, [ArchiveTask]);
    const handler: RecordingInboxHandler = t.handler(ArchiveTask);
    const id = await t.outbox.transaction(async (tx) =>
      tx.sendCommand({ type: 'ArchiveTask', targetService: 'tasks', payload: { taskId: 't-7' } }),
    );
    await eventually(() => handler.calls.length === 1, 'handled');
    expect(handler.calls[0]).toMatchObject({ id, type: 'ArchiveTask', payload: { taskId: 't-7' } });
    await eventually(
      async () => (await t.outbox.record('inbox_commands', id))?.status === 'COMPLETED',
      'inbox record completed',
    );
  });

  it('events a handler records in its transaction are published once it completes', async () => {
    t = await createOutboxTestApp(inboxOptions, [TaskCreatedInTransaction]);
    const handler = t.handler(TaskCreatedInTransaction);
    handler.onCall = (message, { transaction }) =>
      transaction!.publishEvent({
        id: `${message.id}:indexed`,
        type: 'TaskIndexed',
        aggregateType: 'Task',
        aggregateId: 't-1',
        payload: {},
      });
    await deliver(taskCreated('evt-42'));
    await eventually(() => t.broker.peek('events.TaskIndexed').length === 1, 'follow-up published');
    expect(JSON.parse(t.broker.peek('events.TaskIndexed')[0].body.toString())).toMatchObject({
      id: 'evt-42:indexed',
    });
  });
});
