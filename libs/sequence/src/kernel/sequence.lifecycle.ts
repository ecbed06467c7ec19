import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  type OnModuleDestroy,
} from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';
import type { ChannelBinding } from './channel-binding';
import type { Transport } from '../ports/transport.port';
import { ChannelRegistry } from './channel.registry';
import type { NestModule } from './handler.explorer';
import { ConsumerHost } from './consumer.host';
import { inProcessStateWarning } from './in-process-state.warning';
import { SEQUENCE_TRANSPORT } from './tokens';

/** A part of the module with a life of its own (a sweeper, the outbox runtime, an adapter). */
export interface LifecyclePart {
  /** At bootstrap, before the subscriptions open. */
  start?(): Promise<void> | void;
  /** First at shutdown, once the subscriptions are closed: what runs application code stops. */
  stopConsuming?(): Promise<void>;
  /** Before application shutdown: timers and background work stop. */
  stop?(): Promise<void>;
  /** Last, at application shutdown: connections close. */
  close?(): Promise<void>;
}

/** Injection token of the parts, in the order they start (they stop in the reverse order). */
export const LIFECYCLE_PARTS = Symbol('nest-sequence:lifecycle-parts');

/**
 * The one owner of the module's life at run time. At bootstrap it starts the parts (the outbox
 * runtime, the sweepers), then opens every handler's subscription; if anything fails, it stops
 * what it started and the application does not start. At shutdown, in the earliest hook of this
 * module (`onModuleDestroy`: before those of the modules it imports; the root module's and, when
 * this one is global, every other module's come first), it closes the subscriptions after the
 * deliveries in progress, then stops what runs handlers; timers and relays stop in
 * `beforeApplicationShutdown` (what other modules record while they are destroyed is still
 * relayed), and connections close in `onApplicationShutdown`.
 */
@Injectable()
export class SequenceLifecycle
  implements
    OnApplicationBootstrap,
    OnModuleDestroy,
    BeforeApplicationShutdown,
    OnApplicationShutdown
{
  private readonly logger = new Logger('SequenceModule');
  /** True from the moment the subscriptions are open until shutdown begins. */
  private running = false;
  /** True once shutdown began: no handler is registered or subscribed after. */
  private stopping = false;
  /** Set while the bootstrap runs: what it opens is `registry.all()` as of then. */
  private bootstrapping: Promise<void> | undefined;
  /** The bindings the bootstrap took to open. */
  private readonly openedAtBootstrap = new Set<ChannelBinding>();

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly registry: ChannelRegistry,
    private readonly host: ConsumerHost,
    @Inject(LIFECYCLE_PARTS) private readonly parts: readonly LifecyclePart[],
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    this.bootstrapping = this.bootstrap();
    try {
      await this.bootstrapping;
    } finally {
      this.bootstrapping = undefined;
    }
  }

  private async bootstrap(): Promise<void> {
    const started: LifecyclePart[] = [];
    try {
      for (const part of this.parts) {
        started.unshift(part);
        await part.start?.();
      }
      const bindings = this.registry.all();
      for (const binding of bindings) this.openedAtBootstrap.add(binding);
      const warning = inProcessStateWarning(this.transport.name, bindings);
      if (warning) this.logger.warn(warning);
      await this.host.open(bindings, { closeOnFailure: false });
      this.running = true;
    } catch (error) {
      // Nest runs no shutdown hook for an application whose init failed: nothing may run on.
      // Handlers already consuming stop first, as at shutdown: their deliveries end (within
      // shutdownTimeoutMs), their retries are not started again, their messages handed back.
      this.stopping = true;
      await this.host.close().catch(() => undefined);
      for (const part of started) {
        await part.stopConsuming?.().catch(() => undefined);
        await part.stop?.().catch(() => undefined);
        await part.close?.().catch(() => undefined);
      }
      throw error;
    }
  }

  /**
   * Module init failed (a handler's options refused, the module imported twice): Nest runs no
   * hook after that, so what the parts opened as they were built (the module's connections, its
   * metrics in the application's registry) is closed now.
   */
  async initFailed(): Promise<void> {
    this.stopping = true;
    // Some may run already: another module's onModuleInit that used OutboxService started it.
    await this.each('stopConsuming', (part) => part.stopConsuming?.());
    await this.each('stop', (part) => part.stop?.(), { together: true });
    await this.each('close', (part) => part.close?.());
  }

  /** Whether shutdown began (`onModuleDestroy`): handlers added from then on are refused. */
  get shuttingDown(): boolean {
    return this.stopping;
  }

  /**
   * Handlers bound after the explorer ran (a microservice's, when it listens): registered now, all
   * or none, so that a second consumer of a channel is refused; opened now when the module is
   * running (taken out again if they fail to open, so that listening can be tried again),
   * otherwise with the others at bootstrap. Once shutdown began, refused: neither registered nor
   * opened (taken out again, and what they opened closed, when shutdown overtakes the call).
   * @returns `false` when refused because shutdown began; `true` otherwise
   * @throws SequenceHandlerConflictError when another handler already consumes a channel
   */
  async addBindings(bindings: readonly ChannelBinding[]): Promise<boolean> {
    if (this.stopping) return false;
    const takeOut = this.registry.addAll(bindings);
    // A bootstrap under way may have taken them already, or not: wait for it, open the rest.
    await this.bootstrapping?.catch(() => undefined);
    let opened = !this.stopping;
    if (opened && this.running) {
      // A shared channel already consumed (an inbox handler joining another's) needs no second
      // subscription: its consumer dispatches to every handler of the channel.
      const rest = bindings.filter(
        (binding) => !this.openedAtBootstrap.has(binding) && !this.host.consumes(binding.channel),
      );
      try {
        opened = await this.host.open(rest);
      } catch (error) {
        takeOut();
        throw error;
      }
    }
    if (!opened) takeOut();
    return opened;
  }

  async onModuleDestroy(): Promise<void> {
    this.stopping = true;
    this.running = false;
    await this.host.close();
    await this.each('stopConsuming', (part) => part.stopConsuming?.());
  }

  async beforeApplicationShutdown(): Promise<void> {
    // Together: every timer stops at once, and the waits for runs in progress overlap, so the
    // longest wait bounds shutdown, not their sum.
    await this.each('stop', (part) => part.stop?.(), { together: true });
  }

  async onApplicationShutdown(): Promise<void> {
    await this.each('close', (part) => part.close?.());
  }

  /**
   * Runs `step` on every part, last started first (or on all at once, `together`); one failing
   * does not stop the others.
   */
  private async each(
    name: string,
    step: (part: LifecyclePart) => Promise<void> | undefined,
    { together = false } = {},
  ): Promise<void> {
    const run = async (part: LifecyclePart) => {
      try {
        await step(part);
      } catch (error) {
        this.logger.warn(`${name} of ${part.constructor.name} failed: ${errorMessage(error)}`);
      }
    };
    const parts = [...this.parts].reverse();
    if (together) {
      await Promise.all(parts.map(run));
      return;
    }
    for (const part of parts) await run(part);
  }
}

/**
 * Module init failed: every SequenceModule instance of the application is told (each one's parts
 * are built, and Nest runs no hook of any after the failure), not only the one that found it.
 */
export async function initFailedEverywhere(modules: Iterable<NestModule>): Promise<void> {
  for (const module of modules) {
    const lifecycle = module.getProviderByKey<SequenceLifecycle>(SequenceLifecycle)?.instance;
    await lifecycle?.initFailed();
  }
}
