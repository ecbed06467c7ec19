import {
  Injectable,
  Module,
  type INestApplicationContext,
  type LoggerService,
} from '@nestjs/common';
import { LazyModuleLoader } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import {
  ClaimCheck,
  ClaimCheckService,
  InboxHandler,
  InMemoryTransport,
  ReassembledPayload,
  Resequenced,
  SequenceHandlerConflictError,
  SequenceModule,
  SequenceOptionsError,
  SequencedHandler,
  SplitterService,
  type ClaimedPayload,
  type OutboxCommand,
  type OutboxEvent,
  type ResequencedEvent,
} from 'nest-sequence';
import {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  ResequenceHeader,
} from 'nest-sequence/wire';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';

// Nest runs no lifecycle hook in a module that `LazyModuleLoader.load` adds to a running
// application: the module finds the handlers of such a module as the load builds it.

class CapturingLogger implements LoggerService {
  readonly logs: string[] = [];
  readonly warnings: string[] = [];
  log(message: unknown): void {
    this.logs.push(String(message));
  }
  error(): void {}
  warn(message: unknown): void {
    this.warnings.push(String(message));
  }
}

/**
 * An in-memory transport whose subscriptions to `heldChannel` wait for `release()`, and which
 * counts those not closed.
 */
class HeldSubscribeTransport extends InMemoryTransport {
  openOnHeldChannel = 0;
  private opened!: () => void;
  /** Resolves once a subscription to the held channel is waiting. */
  readonly waiting = new Promise<void>((resolve) => (this.opened = resolve));
  release!: () => void;
  private readonly held = new Promise<void>((resolve) => (this.release = resolve));

  constructor(private readonly heldChannel: string) {
    super();
  }

  override async subscribe(
    ...args: Parameters<InMemoryTransport['subscribe']>
  ): ReturnType<InMemoryTransport['subscribe']> {
    if (args[0] !== this.heldChannel) return super.subscribe(...args);
    this.opened();
    await this.held;
    const subscription = await super.subscribe(...args);
    this.openOnHeldChannel += 1;
    return {
      channel: subscription.channel,
      close: async () => {
        this.openOnHeldChannel -= 1;
        await subscription.close();
      },
    };
  }
}

/** An in-memory transport that counts the subscriptions opened, and not closed, per channel. */
class CountingSubscribeTransport extends InMemoryTransport {
  private readonly open = new Map<string, number>();

  subscribed(channel: string): number {
    return this.open.get(channel) ?? 0;
  }

  override async subscribe(
    ...args: Parameters<InMemoryTransport['subscribe']>
  ): ReturnType<InMemoryTransport['subscribe']> {
    const channel = args[0];
    const subscription = await super.subscribe(...args);
    this.open.set(channel, this.subscribed(channel) + 1);
    return {
      channel: subscription.channel,
      close: async () => {
        this.open.set(channel, this.subscribed(channel) - 1);
        await subscription.close();
      },
    };
  }
}

@Injectable()
class StudyArchive {
  readonly received: string[] = [];
  /** Awaited at the start of every call, e.g. to hold the handler mid-call. */
  onCall?: () => Promise<void>;
  @SequencedHandler({ channel: 'lazy.studies' })
  async archive(study: ReassembledPayload): Promise<void> {
    await this.onCall?.();
    this.received.push((await study.toBuffer()).toString());
  }
}
@Module({ providers: [StudyArchive] })
class ArchiveModule {}

@Injectable()
class Scans {
  readonly received: string[] = [];
  @ClaimCheck({ channel: 'lazy.scans' })
  async keep(scan: ClaimedPayload): Promise<void> {
    this.received.push((await scan.toBuffer()).toString());
  }
}
@Module({ providers: [Scans] })
class ScansModule {}

@Injectable()
class Statuses {
  readonly received: string[] = [];
  @Resequenced({ channel: 'lazy.statuses', gap: { timeoutMs: 60_000, policy: 'alert' } })
  async advance(event: ResequencedEvent): Promise<void> {
    this.received.push(`${event.key}#${event.seq}`);
  }
}
@Module({ providers: [Statuses] })
class StatusesModule {}

@Injectable()
class Tasks {
  readonly received: string[] = [];
  @InboxHandler({ event: 'TaskCreated' })
  async created(event: OutboxEvent): Promise<void> {
    this.received.push(event.id);
  }
}
@Module({ providers: [Tasks] })
class TasksModule {}

@Injectable()
class TaskArchive {
  readonly received: string[] = [];
  @InboxHandler({ command: 'ArchiveTask', channel: 'lazy.commands' })
  async archive(command: OutboxCommand): Promise<void> {
    this.received.push(command.id);
  }
}
@Module({ providers: [TaskArchive] })
class TaskArchiveModule {}

/** An inbox message of `kind` as another service's relay would publish it. */
function inboxMessage(kind: 'event' | 'command', id: string, type: string) {
  const message =
    kind === 'event'
      ? {
          id,
          type,
          aggregateType: 'Task',
          aggregateId: 't-1',
          payload: {},
          occurredAt: new Date().toISOString(),
        }
      : { id, type, targetService: 'tasks', payload: {} };
  return {
    body: Buffer.from(JSON.stringify(message)),
    headers: {
      [MESSAGE_ID_HEADER]: id,
      [MESSAGE_KIND_HEADER]: kind,
      [MESSAGE_TYPE_HEADER]: type,
      'content-type': 'application/json',
    },
  };
}

const apps: INestApplicationContext[] = [];

afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

/** A started application on the in-memory defaults, with `providers` loaded eagerly. */
async function start(
  providers: Array<new (...args: never[]) => unknown> = [],
  logger: LoggerService | false = false,
  transport = new InMemoryTransport(),
) {
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        transport,
        tuning: { sweepers: { expiry: { intervalMs: false }, gaps: { intervalMs: false } } },
      }),
    ],
    providers,
  }).compile();
  moduleRef.useLogger(logger);
  const app = await moduleRef.init();
  apps.push(app);
  const loader = app.get(LazyModuleLoader);
  return { app, transport, load: (module: new () => unknown) => loader.load(() => module) };
}

describe('handlers of a module loaded lazily, once the application runs', () => {
  it('@SequencedHandler: receives the sequences of its channel', async () => {
    const { app, load } = await start();

    const moduleRef = await load(ArchiveModule);
    await app.get(SplitterService).send('lazy.studies', Buffer.from('study 1'));

    const archive = moduleRef.get(StudyArchive);
    await eventually(() => archive.received.length === 1, 'the lazy handler to receive');
    expect(archive.received).toEqual(['study 1']);
  });

  it('@ClaimCheck: receives the payloads of its channel', async () => {
    const { app, load } = await start();

    const moduleRef = await load(ScansModule);
    await app.get(ClaimCheckService).publish('lazy.scans', Buffer.from('scan 1'));

    const scans = moduleRef.get(Scans);
    await eventually(() => scans.received.length === 1, 'the lazy handler to receive');
    expect(scans.received).toEqual(['scan 1']);
  });

  it("@Resequenced: receives each key's events in order", async () => {
    const { transport, load } = await start();

    const moduleRef = await load(StatusesModule);
    for (const seq of [2, 1, 3]) {
      await transport.publish('lazy.statuses', Buffer.from('{}'), {
        [ResequenceHeader.key]: 'pix-1',
        [ResequenceHeader.seq]: seq,
      });
    }

    const statuses = moduleRef.get(Statuses);
    await eventually(() => statuses.received.length === 3, 'the lazy handler to receive');
    expect(statuses.received).toEqual(['pix-1#1', 'pix-1#2', 'pix-1#3']);
  });

  it('@InboxHandler: handles each message id once, in an app that started with no outbox', async () => {
    const { transport, load } = await start();

    const moduleRef = await load(TasksModule);
    const { body, headers } = inboxMessage('event', 'task-1', 'TaskCreated');
    await transport.publish('events.TaskCreated', body, headers);
    await transport.publish('events.TaskCreated', body, headers);

    const tasks = moduleRef.get(Tasks);
    await eventually(() => tasks.received.length === 1, 'the lazy handler to receive');
    await transport.whenIdle();
    expect(tasks.received).toEqual(['task-1']);
  });

  it('@InboxHandler: handles commands once the inbox runs for events only', async () => {
    const { app, transport, load } = await start([Tasks]);

    const moduleRef = await load(TaskArchiveModule);
    const command = inboxMessage('command', 'archive-1', 'ArchiveTask');
    await transport.publish('lazy.commands', command.body, command.headers);
    const event = inboxMessage('event', 'task-1', 'TaskCreated');
    await transport.publish('events.TaskCreated', event.body, event.headers);

    const archive = moduleRef.get(TaskArchive);
    await eventually(() => archive.received.length === 1, 'the lazy handler to receive');
    expect(archive.received).toEqual(['archive-1']);
    await eventually(() => app.get(Tasks).received.length === 1, 'the eager handler to receive');
  });

  it('subscribes once when the module is loaded again', async () => {
    const logger = new CapturingLogger();
    const { load } = await start([], logger);

    const first = await load(ArchiveModule);
    const second = await load(ArchiveModule);

    expect(second).toBe(first);
    expect(logger.logs.filter((line) => line.includes('lazy.studies'))).toEqual([
      expect.stringMatching(/^StudyArchive\.archive consumes sequences from lazy\.studies/),
    ]);
  });

  it('@InboxHandler on a channel an eager inbox handler consumes: joins its subscription, opens no second one', async () => {
    @Injectable()
    class TaskRestore {
      readonly received: string[] = [];
      @InboxHandler({ command: 'RestoreTask', channel: 'lazy.commands' })
      async restore(command: OutboxCommand): Promise<void> {
        this.received.push(command.id);
      }
    }
    @Module({ providers: [TaskRestore] })
    class TaskRestoreModule {}
    const transport = new CountingSubscribeTransport();
    const { app, load } = await start([TaskArchive], false, transport);
    expect(transport.subscribed('lazy.commands')).toBe(1);

    const moduleRef = await load(TaskRestoreModule);
    for (const [id, type] of [
      ['restore-1', 'RestoreTask'],
      ['archive-1', 'ArchiveTask'],
    ]) {
      const command = inboxMessage('command', id, type);
      await transport.publish('lazy.commands', command.body, command.headers);
    }

    const restore = moduleRef.get(TaskRestore);
    await eventually(() => restore.received.length === 1, 'the lazy handler to receive');
    await eventually(() => app.get(TaskArchive).received.length === 1, 'the eager one to receive');
    expect(transport.subscribed('lazy.commands')).toBe(1);
  });

  it('fails the load when a handler takes a channel another handler consumes, naming both', async () => {
    @Injectable()
    class EagerArchive {
      readonly received: string[] = [];
      @SequencedHandler({ channel: 'lazy.studies' })
      async archive(study: ReassembledPayload): Promise<void> {
        this.received.push(study.sequenceId);
      }
    }
    const { app, load } = await start([EagerArchive]);

    const error = await load(ArchiveModule).catch((thrown: unknown) => thrown);

    expect(error).toBeInstanceOf(SequenceHandlerConflictError);
    expect((error as Error).message).toContain('EagerArchive.archive');
    expect((error as Error).message).toContain('StudyArchive.archive');
    // The eager handler still consumes the channel, alone.
    const splitter = app.get(SplitterService);
    for (let i = 1; i <= 4; i++) await splitter.send('lazy.studies', Buffer.from(`study ${i}`));
    const eager = app.get(EagerArchive);
    await eventually(() => eager.received.length === 4, 'the eager handler to receive all');
  });

  it('fails the load when the handler class is a provider of a module loaded already, naming both', async () => {
    const { load } = await start([StudyArchive]);

    const error = await load(ArchiveModule).catch((thrown: unknown) => thrown);

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).problems).toEqual([
      expect.stringContaining('StudyArchive is a provider of RootTestModule and of ArchiveModule'),
    ]);
  });

  it('fails the load of a module that imports SequenceModule again', async () => {
    @Module({ imports: [SequenceModule.forRoot()], providers: [StudyArchive] })
    class SelfContainedModule {}
    const { load } = await start();

    const error = await load(SelfContainedModule).catch((thrown: unknown) => thrown);

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).problems).toEqual([
      expect.stringMatching(/^SequenceModule is imported by a module loaded lazily/),
    ]);
  });

  it("fails the load on a handler's invalid options, naming the method", async () => {
    @Injectable()
    class Nameless {
      @SequencedHandler({ channel: '' })
      async archive(_study: ReassembledPayload): Promise<void> {}
    }
    @Module({ providers: [Nameless] })
    class NamelessModule {}
    const { load } = await start();

    const error = await load(NamelessModule).catch((thrown: unknown) => thrown);

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).problems).toEqual([
      '@SequencedHandler on Nameless.archive needs a non-empty channel.',
    ]);
  });

  it("lets a lazy handler's delivery in progress finish at shutdown, then takes no more", async () => {
    const { app, transport, load } = await start();
    apps.splice(apps.indexOf(app), 1);
    const moduleRef = await load(ArchiveModule);
    const archive = moduleRef.get(StudyArchive);
    let entered!: () => void;
    const inCall = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    archive.onCall = () => {
      entered();
      return new Promise<void>((resolve) => (release = resolve));
    };
    await app.get(SplitterService).send('lazy.studies', Buffer.from('study 1'));
    await inCall;

    let closed = false;
    const closing = app.close().then(() => (closed = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(closed).toBe(false);
    release();
    await closing;

    expect(archive.received).toEqual(['study 1']);
    await publishAll(transport, 'lazy.studies', makeFragments('after-close', bytes(10), 10));
    expect(transport.depth('lazy.studies')).toBe(1);
  });
});

describe('a module loaded lazily once the shutdown began', () => {
  it('resolves the load, subscribes none of its handlers and warns, naming the module', async () => {
    @Injectable()
    class Holding {
      release!: () => void;
      entered!: () => void;
      readonly inCall = new Promise<void>((resolve) => (this.entered = resolve));
      @SequencedHandler({ channel: 'lazy.holding' })
      async hold(_study: ReassembledPayload): Promise<void> {
        this.entered();
        await new Promise<void>((resolve) => (this.release = resolve));
      }
    }
    const logger = new CapturingLogger();
    const { app, transport, load } = await start([Holding], logger);
    apps.splice(apps.indexOf(app), 1);
    const holding = app.get(Holding);
    await app.get(SplitterService).send('lazy.holding', Buffer.from('held'));
    await holding.inCall;
    // The shutdown waits for the delivery in progress: it has begun, and is not over.
    const closing = app.close();
    await new Promise((resolve) => setTimeout(resolve, 20));

    const moduleRef = await load(ArchiveModule);

    expect(logger.warnings).toEqual([
      expect.stringMatching(
        /^ArchiveModule was loaded after SequenceModule's shutdown began: its handlers are not subscribed \(StudyArchive\.archive\)/,
      ),
    ]);
    expect(logger.logs.filter((line) => line.includes('lazy.studies'))).toEqual([]);
    holding.release();
    await closing;
    await publishAll(transport, 'lazy.studies', makeFragments('after-close', bytes(10), 10));
    expect(transport.depth('lazy.studies')).toBe(1);
    expect(moduleRef.get(StudyArchive).received).toEqual([]);
  });

  it('closes a subscription of the load that the shutdown overtook, and warns', async () => {
    const logger = new CapturingLogger();
    const transport = new HeldSubscribeTransport('lazy.studies');
    const { app, load } = await start([], logger, transport);
    apps.splice(apps.indexOf(app), 1);

    const loading = load(ArchiveModule);
    await transport.waiting;
    await app.close();
    transport.release();
    const moduleRef = await loading;

    expect(transport.openOnHeldChannel).toBe(0);
    await publishAll(transport, 'lazy.studies', makeFragments('after-close', bytes(10), 10));
    await transport.whenIdle();
    expect(transport.depth('lazy.studies')).toBe(1);
    expect(moduleRef.get(StudyArchive).received).toEqual([]);
    expect(logger.warnings).toEqual([
      expect.stringMatching(
        /^ArchiveModule was loaded after SequenceModule's shutdown began: its handlers are not subscribed \(StudyArchive\.archive\)/,
      ),
    ]);
  });
});
