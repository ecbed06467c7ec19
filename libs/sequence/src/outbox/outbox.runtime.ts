import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { errorMessage } from '../core/errors/caught';
import type { LifecyclePart } from '../kernel/sequence.lifecycle';
import {
  OUTBOX_STORE_SOURCE,
  RESOLVED_OPTIONS,
  SEQUENCE_TRANSPORT,
  type OutboxStoreSource,
} from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { BOX_NAMES, type BoxName, type OutboxStore } from '../ports/outbox-store.port';
import type { Disposition, InboundMessage, Transport } from '../ports/transport.port';
import { BoxLoop } from './box-loop';
import { InboxHandlers, inboxOf } from './inbox-handlers';
import { InboxProcessor } from './inbox.processor';
import { InboxReceiver } from './inbox.receiver';
import { OutboxMetrics } from './outbox.metrics';
import { OutboxPurge } from './outbox.purge';
import { OutboxRelay } from './outbox.relay';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { BoxLifecycle } from './outbox.events';
import { messageValidation } from './outbox-message.rules';

type Worker = OutboxRelay | InboxProcessor;

/**
 * The Outbox / Inbox at run time: opens the store (the one in the options, or an embedded SQLite
 * database), migrates it, and runs the relays, the inbox processors and the purge. It starts at
 * bootstrap when the app configured `outbox` or has `@InboxHandler`s (the inbox channels'
 * subscriptions are the consumer host's, opened after it), and otherwise at the first use of
 * `OutboxService`. {@link SequenceLifecycle} stops it: the inbox processors with the consumers,
 * the relays (which run no application code) in `beforeApplicationShutdown`, so that what other
 * modules record while they are destroyed is still relayed.
 */
@Injectable()
export class OutboxRuntime implements LifecyclePart {
  private readonly logger = new Logger('Outbox');
  private starting: Promise<OutboxStore> | undefined;
  private ownedStore: OutboxStore | undefined;
  private readonly loops = new Map<BoxName, BoxLoop>();
  private readonly workers: Worker[] = [];
  private receiver: InboxReceiver | undefined;
  private unwatch: (() => Promise<void>) | undefined;
  private purge: OutboxPurge | undefined;
  private stopped = false;
  /**
   * How many inbox handlers there were when the inbox (its receiver and processors) was last set
   * up: a lazily loaded module may add some once the outbox runs.
   */
  private inboxSetUpFor = 0;
  /** Boxes whose records are claimed in partition order: appends to them take partition locks. */
  readonly orderedBoxes: ReadonlySet<BoxName>;

  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(OUTBOX_STORE_SOURCE) private readonly source: OutboxStoreSource,
    private readonly handlers: InboxHandlers,
    private readonly metrics: OutboxMetrics,
    private readonly events: SequenceEvents,
    @Optional() private readonly schedulerRegistry?: SchedulerRegistry,
  ) {
    this.orderedBoxes = new Set(BOX_NAMES.filter((box) => options.outbox.boxes[box].ordered));
  }

  /** At bootstrap: starts when the app asked for the outbox or handles inbox messages. */
  async start(): Promise<void> {
    if (!this.options.outbox.configured && this.handlers.all().length === 0) return;
    // The messages' class-validator rules, attached now rather than at the first message, so
    // that the application's own code can validate OutboxEvent / OutboxCommand from the start.
    messageValidation();
    await this.ready();
  }

  /**
   * Whether the application uses the outbox or inbox (a store configured, or inbox handlers): the
   * operator console reads the store only then, rather than open an embedded one for nothing.
   */
  get inUse(): boolean {
    return this.options.outbox.configured || this.handlers.all().length > 0;
  }

  /**
   * The store's adapter name (`postgres`, `sqlite`): the one given, or the embedded one once
   * opened; `undefined` before the embedded one is.
   */
  get storeName(): string | undefined {
    return (this.source.store ?? this.ownedStore)?.name;
  }

  /** The store, once opened, migrated and running (started now if it was not). */
  ready(): Promise<OutboxStore> {
    if (this.stopped) return Promise.reject(new Error('the outbox has been shut down'));
    this.starting ??= this.run().catch((error: unknown) => {
      this.starting = undefined; // the next use tries again
      throw error;
    });
    return this.starting;
  }

  /**
   * The store as it stands, for a reader that must start nothing (a health check): the one started
   * or starting; else the one given in the options, or the embedded one if already opened (before
   * bootstrap has started them); `undefined` when the embedded store was never opened. Rejects
   * once the outbox has been shut down.
   */
  current(): Promise<OutboxStore> | undefined {
    if (this.stopped) return Promise.reject(new Error('the outbox has been shut down'));
    if (this.starting) return this.starting;
    const store = this.source.store ?? this.ownedStore;
    return store && Promise.resolve(store);
  }

  /**
   * Records one message of an inbox channel (the consumer host's subscriptions hand them here);
   * never throws.
   */
  receiveInbox(message: InboundMessage): Promise<Disposition> {
    if (!this.stopped && this.handlers.all().length !== this.inboxSetUpFor) {
      return this.setUpInbox().then(
        () => this.receiveInbox(message),
        (error: unknown) => ({
          action: 'requeue',
          delayMs: this.options.tuning.backpressureDelayMs,
          reason: `the inbox could not start: ${errorMessage(error)}`,
        }),
      );
    }
    if (!this.receiver) {
      return Promise.resolve({
        action: 'requeue',
        delayMs: this.options.tuning.backpressureDelayMs,
        reason: 'the inbox is not running',
      });
    }
    return this.receiver.receive(message);
  }

  /**
   * Sets the inbox up for the handlers there are now: inbox handlers of a module loaded lazily
   * may come once the outbox runs without any, or with handlers of the other kind of message
   * only. Starts the outbox if it did not start, else adds the receiver and the processors that
   * are missing; they stop with the others.
   */
  private async setUpInbox(): Promise<void> {
    const count = this.handlers.all().length;
    const store = await this.ready();
    if (this.stopped) return;
    this.receiver ??= this.inboxReceiver(store);
    for (const box of ['inbox_events', 'inbox_commands'] as const) {
      if (this.loops.has(box)) continue;
      for (const loop of this.loopsFor(box, store)) {
        loop.start(this.options.outbox.boxes[box].pollIntervalMs);
      }
    }
    this.inboxSetUpFor = count;
  }

  /** Asks a box's relay or processor to look for due records now. */
  wake(box: BoxName): void {
    this.loops.get(box)?.wake();
  }

  /**
   * Runs the retention purge now (it runs every `tuning.sweepers.purge.intervalMs`), or joins
   * the one in progress; resolves to the number of records deleted.
   */
  async purgeNow(): Promise<number> {
    await this.ready();
    return this.purge!.sweep();
  }

  /** Resolves once no relay or processor cycle is running or asked for (for tests). */
  async idle(): Promise<void> {
    for (const loop of this.loops.values()) await loop.idle();
  }

  /**
   * Stops the inbox processors, waiting for the handlers in progress (at most `shutdownTimeoutMs`:
   * a call still running then is abandoned, its record handed back uncounted), once the inbox
   * channels' subscriptions are closed. Nest calls the root module's hooks first and a global module's
   * last: close what handlers use in `onApplicationShutdown` to be safe in every layout.
   */
  async stopConsuming(): Promise<void> {
    await this.starting?.catch(() => undefined);
    await this.stopLoops((box) => box.startsWith('inbox'));
  }

  /** Nothing of the outbox runs from now on: the relays, the purge, the store's watch, the gauges. */
  async stop(): Promise<void> {
    this.stopped = true;
    // A start in progress (a use of OutboxService, retried after a failed one) is waited for.
    await this.starting?.catch(() => undefined);
    await this.stopLoops(() => true);
    await this.purge?.stop();
    await this.unwatch?.().catch(() => undefined);
    this.unwatch = undefined;
    this.metrics.readStatsFrom(undefined);
  }

  /** Closes the embedded store, when it opened one. */
  async close(): Promise<void> {
    const store = this.ownedStore;
    this.ownedStore = undefined;
    await store?.close();
  }

  /** Stops the loops of the boxes `which` selects. */
  private async stopLoops(which: (box: BoxName) => boolean): Promise<void> {
    const { shutdownTimeoutMs } = this.options;
    for (const worker of this.workers) if (which(worker.box)) worker.stop(shutdownTimeoutMs);
    for (const [box, loop] of this.loops) if (which(box)) await loop.stop();
  }

  private async run(): Promise<OutboxStore> {
    if (!this.source.store && this.transport.name !== 'in-memory') {
      this.logger.warn(
        `the outbox runs on the embedded in-memory SQLite store, but the transport is ` +
          `${this.transport.name}: rows not yet relayed, inbox records not yet handled and the ` +
          'ids that recognise duplicates are lost at restart; give outbox.store a ' +
          'PostgresOutboxStore (or stores: postgres(url), or a SqliteOutboxStore on a file)',
      );
    }
    const loops: BoxLoop[] = [];
    let store: OutboxStore;
    try {
      store = this.source.store ?? (this.ownedStore ??= await this.source.openEmbedded());
      if (this.options.outbox.migrate) await store.migrate();
      // Counted before the processors are chosen: handlers added meanwhile are set up later.
      const inboxHandlers = this.handlers.all().length;
      for (const box of BOX_NAMES) loops.push(...this.loopsFor(box, store));
      this.unwatch = await store.watch((box) => this.wake(box));
      if (inboxHandlers > 0) this.receiver = this.inboxReceiver(store);
      this.inboxSetUpFor = inboxHandlers;
    } catch (error) {
      // Nothing half-started may keep running: the next use of the outbox starts afresh.
      for (const loop of loops) await loop.stop();
      await this.unwatch?.().catch(() => undefined);
      this.receiver = this.unwatch = undefined;
      this.workers.length = 0;
      this.loops.clear();
      throw error;
    }
    // Last: only a fully started outbox claims anything.
    for (const loop of loops) loop.start(this.options.outbox.boxes[loop.box].pollIntervalMs);
    this.metrics.readStatsFrom((box) => store.stats(box));
    this.purge = new OutboxPurge(store, this.options, this.schedulerRegistry);
    this.purge.start();
    return store;
  }

  private inboxReceiver(store: OutboxStore): InboxReceiver {
    return new InboxReceiver(
      store,
      this.handlers,
      this.metrics,
      this.logger,
      (kind) => this.wake(inboxOf(kind)),
      new BoxLifecycle(this.events, 'inbox_events'),
      this.options.tuning,
    );
  }

  /**
   * The relay or processor of `box`, registered, not started: a loop of up to `concurrency`
   * claims at once over one worker (their claims never overlap: each takes rows the others do not
   * hold); none when not enabled.
   */
  private loopsFor(box: BoxName, store: OutboxStore): BoxLoop[] {
    const options = this.options.outbox.boxes[box];
    const enabled =
      options.enabled ?? this.handlers.has(box === 'inbox_events' ? 'event' : 'command');
    if (!enabled) return [];
    const lifecycle = new BoxLifecycle(this.events, box);
    const worker: Worker =
      box === 'outbox_events' || box === 'outbox_commands'
        ? new OutboxRelay(box, store, this.transport, this.options, this.metrics, lifecycle)
        : new InboxProcessor(
            box,
            store,
            this.handlers,
            options,
            this.metrics,
            this.orderedBoxes,
            lifecycle,
            this.options.tracing,
          );
    const relays = box.startsWith('outbox');
    // A relay's claims cost about the same whatever their size, and its publishes are quick: a
    // steady stream goes out in larger claims, one after the other, until one comes back full.
    // A processor's handlers are the app's and may take long: commits start claims beside them.
    const loop = new BoxLoop(
      box,
      `${box} ${relays ? 'relay' : 'processor'}`,
      (locked) => worker.cycle(locked),
      this.logger,
      options.concurrency,
      relays ? 'when-behind' : 'on-wake',
    );
    this.workers.push(worker);
    this.loops.set(box, loop);
    return [loop];
  }
}
