import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { BootstrapAbort } from '../bootstrap-abort';
import { InboxHandlerRegistry, inboxOf } from '../discovery/inbox-handler.registry';
import { OutboxMetrics } from '../observability/outbox.metrics';
import { BOX_NAMES, type BoxName, type OutboxStore } from '../ports/outbox-store.port';
import type { Transport } from '../ports/transport.port';
import { IntervalJob } from '../scheduling/interval-job';
import { SEQUENCE_TRANSPORT } from '../sequence.constants';
import { asError, errorMessage } from '../core/errors/caught';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { BoxLoop } from './box-loop';
import { InboxProcessor } from './inbox.processor';
import { InboxReceiver } from './inbox.receiver';
import { OUTBOX_OPTIONS } from './outbox.constants';
import type { ResolvedOutboxOptions } from './outbox.options';
import { OutboxRelay } from './outbox.relay';
import { messageValidation } from './outbox-message.rules';

export const OUTBOX_PURGE_INTERVAL = 'nest-sequence:outbox-purge';

type Worker = OutboxRelay | InboxProcessor;

/**
 * The one owner of the Outbox / Inbox at run time: opens the store (the one in the options, or an
 * embedded SQLite database), migrates it, and starts and stops the relays, the inbox processors,
 * the inbox consumers and the purge job. It starts at bootstrap when the app configured `outbox`
 * or has `@InboxHandler`s, and otherwise at the first use of `OutboxService`.
 */
@Injectable()
export class OutboxRuntime
  implements
    OnApplicationBootstrap,
    OnModuleDestroy,
    BeforeApplicationShutdown,
    OnApplicationShutdown
{
  private readonly logger = new Logger('Outbox');
  private starting: Promise<OutboxStore> | undefined;
  private ownedStore: OutboxStore | undefined;
  private readonly loops = new Map<BoxName, BoxLoop[]>();
  private readonly workers: Worker[] = [];
  private receiver: InboxReceiver | undefined;
  private unwatch: (() => Promise<void>) | undefined;
  private readonly purgeJob: IntervalJob<number>;
  private stopped = false;
  /** Another consumer of the module failed to start: a start in progress undoes itself. */
  private abandoned = false;
  /** Boxes whose records are claimed in partition order: appends to them take partition locks. */
  readonly orderedBoxes: ReadonlySet<BoxName>;

  constructor(
    @Inject(OUTBOX_OPTIONS) private readonly options: ResolvedOutboxOptions,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly handlers: InboxHandlerRegistry,
    private readonly metrics: OutboxMetrics,
    private readonly bootstrap: BootstrapAbort,
    @Optional() schedulerRegistry?: SchedulerRegistry,
  ) {
    this.purgeJob = new IntervalJob(OUTBOX_PURGE_INTERVAL, schedulerRegistry, () => this.purge());
    this.orderedBoxes = new Set(BOX_NAMES.filter((box) => options.boxes[box].ordered));
    bootstrap.onAbort(() => this.abandon());
  }

  async onApplicationBootstrap(): Promise<void> {
    if (this.options.configured || this.handlers.all().length > 0) {
      // The messages' class-validator rules, attached now rather than at the first message, so
      // that the application's own code can validate OutboxEvent / OutboxCommand from the start.
      messageValidation();
      try {
        await this.ready();
      } catch (error) {
        await this.bootstrap.abort();
        throw error;
      }
    }
  }

  /**
   * Another consumer of the module failed to start: nothing of the outbox may run on, and Nest
   * will run no shutdown hook. A start in progress is not waited for (the application's init
   * fails now): it sees `abandoned` at its next step and undoes itself.
   */
  private async abandon(): Promise<void> {
    this.abandoned = true;
    await this.halt(false);
    await this.closeOwnedStore();
  }

  /**
   * Nothing of the outbox runs from now on: its loops, the inbox, the purge, the store's watch,
   * the gauges' reads. `awaitStart`: a start in progress is waited for and stopped once done
   * (shutdown), rather than left to undo itself (abandon).
   */
  private async halt(awaitStart: boolean): Promise<void> {
    this.stopped = true;
    await (awaitStart ? this.stopLoops(() => true) : this.stopStarted(() => true));
    await this.purgeJob.stop();
    await this.unwatch?.().catch(() => undefined);
    this.unwatch = undefined;
    this.metrics.readStatsFrom(undefined);
  }

  private async closeOwnedStore(): Promise<void> {
    const store = this.ownedStore;
    this.ownedStore = undefined;
    await store?.close().catch(() => undefined);
  }

  /** The store, once opened, migrated and running (started now if it was not). */
  ready(): Promise<OutboxStore> {
    if (this.stopped) return Promise.reject(new Error('the outbox has been shut down'));
    this.starting ??= this.start().catch((error: unknown) => {
      this.starting = undefined; // the next use tries again
      throw error;
    });
    return this.starting;
  }

  /** Asks a box's relay or processor to look for due records now. */
  wake(box: BoxName): void {
    for (const loop of this.loops.get(box) ?? []) loop.wake();
  }

  /**
   * Runs the retention purge now (the job runs it every `purgeIntervalMs`), or joins the one in
   * progress; resolves to the number of records deleted.
   */
  purgeNow(): Promise<number> {
    return this.purgeJob.run();
  }

  /** Resolves once no relay or processor cycle is running or asked for (for tests). */
  async idle(): Promise<void> {
    for (const loop of [...this.loops.values()].flat()) await loop.idle();
  }

  /**
   * Stops the inbox: its receiver and processors, waiting for the handlers in progress. In
   * `onModuleDestroy`, the earliest shutdown hook of this module: before the `onModuleDestroy` of
   * the modules Nest destroys after it (those it imports, and those deeper in the application's
   * imports), so that handlers finish while what those provide is open. Nest calls the root
   * module's hooks first and a global module's last: close what handlers use in
   * `onApplicationShutdown` to be safe in every layout. The relays, which run no application
   * code, go on until `beforeApplicationShutdown`: what other modules record while they are
   * destroyed is still relayed.
   */
  async onModuleDestroy(): Promise<void> {
    await this.stopLoops((box) => box.startsWith('inbox'));
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.halt(true); // a start retried since (after a failed one) too
  }

  /**
   * Stops the receiver (with the inbox) and the loops of the boxes `which` selects, those of a
   * start in progress too (once it is done).
   */
  private async stopLoops(which: (box: BoxName) => boolean): Promise<void> {
    await this.starting?.catch(() => undefined);
    await this.stopStarted(which);
  }

  /** {@link stopLoops} for what has started so far. */
  private async stopStarted(which: (box: BoxName) => boolean): Promise<void> {
    await this.receiver?.stop();
    for (const worker of this.workers) if (which(worker.box)) worker.stop();
    for (const [box, loops] of this.loops) {
      if (which(box)) for (const loop of loops) await loop.stop();
    }
  }

  async onApplicationShutdown(): Promise<void> {
    await this.ownedStore?.close();
  }

  private async start(): Promise<OutboxStore> {
    if (!this.options.store && this.transport.name !== 'in-memory') {
      this.logger.warn(
        `the outbox runs on the embedded in-memory SQLite store, but the transport is ` +
          `${this.transport.name}: rows not yet relayed, inbox records not yet handled and the ` +
          'ids that recognise duplicates are lost at restart; give outbox.store a ' +
          'PostgresOutboxStore (or a SqliteOutboxStore on a file)',
      );
    }
    const loops: BoxLoop[] = [];
    let store: OutboxStore;
    try {
      store = this.options.store ?? (this.ownedStore ??= await this.embeddedStore());
      this.assertNotAbandoned();
      if (this.options.migrate) await store.migrate();
      this.assertNotAbandoned();
      for (const box of BOX_NAMES) {
        loops.push(...this.loopsFor(box, store));
      }
      this.unwatch = await store.watch((box) => this.wake(box));
      this.assertNotAbandoned();
      if (this.handlers.all().length > 0) {
        this.receiver = new InboxReceiver(
          store,
          this.transport,
          this.handlers,
          this.metrics,
          this.logger,
          (kind) => this.wake(inboxOf(kind)),
        );
        await this.receiver.start((kind) => this.prefetchFor(kind));
        this.assertNotAbandoned();
      }
    } catch (error) {
      // Nothing half-started may keep running: the next use of the outbox starts afresh.
      for (const loop of loops) await loop.stop();
      await this.receiver?.stop().catch(() => undefined);
      await this.unwatch?.().catch(() => undefined);
      this.receiver = this.unwatch = undefined;
      this.workers.length = 0;
      this.loops.clear();
      if (this.abandoned) await this.closeOwnedStore();
      throw error;
    }
    // Last: only a fully started outbox claims anything.
    for (const loop of loops) loop.start(this.options.boxes[loop.box].pollIntervalMs);
    this.metrics.readStatsFrom((box) => store.stats(box));
    this.purgeJob.start(this.options.purgeIntervalMs, (error) =>
      this.logger.warn(`outbox purge failed; will retry next interval: ${errorMessage(error)}`),
    );
    return store;
  }

  /**
   * The relay or processor of `box`, registered, not started: `concurrency` loops over one worker
   * (their claims never overlap: each takes rows the others do not hold); none when not enabled.
   */
  private loopsFor(box: BoxName, store: OutboxStore): BoxLoop[] {
    const options = this.options.boxes[box];
    const enabled =
      options.enabled ?? this.handlers.has(box === 'inbox_events' ? 'event' : 'command');
    if (!enabled) return [];
    const worker: Worker =
      box === 'outbox_events' || box === 'outbox_commands'
        ? new OutboxRelay(box, store, this.transport, this.options, this.metrics)
        : new InboxProcessor(box, store, this.handlers, options, this.metrics, this.orderedBoxes);
    const role = box.startsWith('outbox') ? 'relay' : 'processor';
    const loops = Array.from(
      { length: options.concurrency },
      () => new BoxLoop(box, `${box} ${role}`, () => worker.cycle(), this.logger),
    );
    this.workers.push(worker);
    this.loops.set(box, loops);
    return loops;
  }

  /**
   * An ordered inbox takes one message at a time from its channels, so that its records are
   * appended in the order this instance received them.
   */
  private prefetchFor(kind: 'event' | 'command'): number {
    return this.options.boxes[inboxOf(kind)].ordered ? 1 : this.options.inboxPrefetch;
  }

  private assertNotAbandoned(): void {
    if (this.abandoned) {
      throw new Error(
        'the outbox did not start: another consumer of the module failed to start first',
      );
    }
  }

  /**
   * The embedded default: an in-memory SQLite database. Loaded only when used, so that an
   * application with an outbox store of its own (or no outbox) needs no better-sqlite3.
   */
  private async embeddedStore(): Promise<OutboxStore> {
    let sqlite: typeof import('../adapters/stores/sqlite/sqlite.outbox-store');
    try {
      sqlite = await import('../adapters/stores/sqlite/sqlite.outbox-store');
    } catch (error) {
      if (!isMissingModule(error, 'better-sqlite3')) throw error;
      throw new SequenceOptionsError('SequenceModule outbox options', [
        'the outbox runs on an embedded SQLite database unless outbox.store is given, and ' +
          'better-sqlite3 is not installed: `npm install better-sqlite3@12`, or give ' +
          'outbox.store a PostgresOutboxStore (nest-sequence/postgres)',
      ]);
    }
    return sqlite.SqliteOutboxStore.open({ filename: ':memory:' });
  }

  /** Deletes completed records past each box's retention, in small batches. */
  private async purge(): Promise<number> {
    const store = await this.ready();
    let deleted = 0;
    let failure: Error | undefined;
    for (const box of BOX_NAMES) {
      const { retentionMs } = this.options.boxes[box];
      if (retentionMs === false || this.purgeJob.stopping) continue;
      try {
        // A retention longer than the epoch is old reaches before it: nothing is that old.
        const completedBefore = Math.max(0, Date.now() - retentionMs);
        const batchSize = this.options.purgeBatchSize;
        // One statement at a time, so that a large backlog (retention just switched on) does not
        // hold the shutdown: it stops between statements and goes on at the next interval.
        while (!this.purgeJob.stopping) {
          const purged = await store.purge(box, { completedBefore, batchSize, maxBatches: 1 });
          deleted += purged;
          if (purged < batchSize) break;
        }
      } catch (error) {
        // One box failing must not leave the boxes after it unpurged.
        failure ??= asError(error);
      }
    }
    if (failure !== undefined) throw failure;
    return deleted;
  }
}

/** Whether `error` is Node's failure to find the package `name` (not one of its own imports failing). */
function isMissingModule(error: unknown, name: string): boolean {
  return (
    (error as { code?: unknown } | null)?.code === 'MODULE_NOT_FOUND' &&
    String((error as Error).message).includes(`'${name}'`)
  );
}
