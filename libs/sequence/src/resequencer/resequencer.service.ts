import { type ResequencerInput } from '../core/resequence-input';
import { ConsumerHost } from '../kernel/consumer.host';
import { Inject, Injectable, Logger } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { HandlerContext } from '../kernel/handler-call';
import type { IntakeBounds, OrderedEvent, OrderedIntake } from '../kernel/pattern-contracts';
import { RESEQUENCER_STORE, RESOLVED_OPTIONS, SEQUENCE_TRANSPORT } from '../kernel/tokens';
import type { ResequencerDefinition } from '../options/resequencer.options';
import type { ResolvedOptions } from '../options/resolved-options';
import { resolveResequencerDefinition } from '../options/resolve-resequencer';
import { ResequencerMetrics } from './resequencer.metrics';
import type {
  OpenGap,
  ResequencerKeyState,
  ResequencerStore,
} from '../ports/resequencer-store.port';
import type { Disposition, Transport } from '../ports/transport.port';
import { GapReporter, type GapListener } from './gap.reporter';
import { Resequencer, type ResequencerBuffers, type ResequencerGaps } from './resequencer';
import { ResequencerCatalog } from './resequencer.catalog';
import type { ResequencedEvent } from './resequenced-event';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { boundedResequencerStore } from './bounded-store';

/**
 * Resequencers by hand, for applications that consume with their own subscriber, and inspection
 * of every resequencer (decorated ones included).
 *
 * @example
 * const statuses = resequencers.create(
 *   { channel: 'pix-status-shuffled', output: 'pix-status-ordered', gap: { timeoutMs: 10_000, policy: 'alert' } },
 * );
 * // in your own consumer: settle the message as the disposition says
 * const disposition = await statuses.receive({ body, headers });
 */
@Injectable()
export class ResequencerService implements OrderedIntake {
  private readonly logger = new Logger('Resequencer');
  /** The store, each step bounded by `tuning.storeTimeoutMs` (see boundedResequencerStore). */
  private readonly store: ResequencerStore;

  constructor(
    @Inject(RESEQUENCER_STORE) store: ResequencerStore,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly catalog: ResequencerCatalog,
    private readonly metrics: ResequencerMetrics,
    private readonly gaps: GapReporter,
    private readonly events: SequenceEvents,
    private readonly host: ConsumerHost,
  ) {
    this.store = boundedResequencerStore(store, options.tuning.storeTimeoutMs);
  }

  /**
   * Defines a resequencer that the module does not consume for: feed it with `receive` and settle
   * each message as the returned disposition says. The module's gap sweeper covers it.
   * `handler` receives released events (unless only `output` is wanted).
   */
  create(
    definition: ResequencerDefinition,
    handler?: (event: ResequencedEvent, context: HandlerContext) => unknown,
  ): Resequencer {
    return this.define('ResequencerService.create', definition, handler);
  }

  /** A resequencer fed by the caller: stream mode's, over its sequences' fragments. */
  defineIntake(
    definedBy: string,
    definition: ResequencerDefinition,
    handler: (event: OrderedEvent, context: HandlerContext) => unknown,
    bounds: IntakeBounds = {},
  ): Resequencer {
    return this.define(definedBy, definition, handler, bounds);
  }

  /**
   * Defines a resequencer (`@Resequenced` methods, `create`, stream mode): its options resolved
   * over the module's, and its name taken in the catalog.
   * @throws SequenceOptionsError naming `definedBy`
   */
  define(
    definedBy: string,
    definition: ResequencerDefinition,
    handler: ((event: ResequencedEvent, context: HandlerContext) => unknown) | undefined,
    bounds: IntakeBounds = {},
  ): Resequencer {
    const resolved = {
      ...resolveResequencerDefinition(definedBy, definition, this.options, (channel) =>
        this.transport.deadLetterChannel(channel),
      ),
      ...bounds,
    };
    if (resolved.callHandler && !handler) {
      // Released events would be counted delivered, and their input acked, with nobody told.
      throw new SequenceOptionsError(definedBy, [
        definition.output === undefined
          ? 'a handler is needed: without one and without an output, released events go nowhere'
          : 'callHandler is true (or left to its default) but no handler was given; pass one, or callHandler: false',
      ]);
    }
    const resequencer = new Resequencer(
      resolved,
      {
        store: this.store,
        options: this.options,
        metrics: this.metrics,
        logger: this.logger,
        events: this.events,
      },
      {
        handler,
        transport: this.transport,
        reportGap: (event) => this.gaps.report(event),
        stop: this.host.stopping,
      },
    );
    this.catalog.add({ definedBy, resequencer });
    return resequencer;
  }

  /** Takes one input message for the resequencer `name` (see {@link Resequencer.receive}). */
  receive(name: string, message: ResequencerInput): Promise<Disposition> {
    return this.named(name).receive(message);
  }

  /** The next sequence `key` waits for, its buffered sequences and its hand-off backlog. */
  inspect(name: string, key: string): Promise<ResequencerKeyState> {
    return this.named(name).inspect(key);
  }

  /** The next sequence `key` waits for (`start` when the key has no state yet). */
  async nextExpected(name: string, key: string): Promise<number> {
    return (await this.inspect(name, key)).next;
  }

  /** The sequences buffered for `key`, ascending. */
  async buffered(name: string, key: string): Promise<readonly number[]> {
    return (await this.inspect(name, key)).buffered;
  }

  /**
   * Keys of `name` waiting on a gap, oldest gap first: those due for the gap policy, and those
   * whose alert went out and which still wait (`alerted: true`).
   */
  openGaps(name: string, limit = 100): Promise<OpenGap[]> {
    return this.named(name).openGaps(limit);
  }

  /** Every resequencer's buffered events and bytes against its scope-wide bounds, by name. */
  async buffers(): Promise<Record<string, ResequencerBuffers>> {
    const entries = await Promise.all(
      this.catalog
        .all()
        .map(async ({ resequencer }) => [resequencer.name, await resequencer.buffers()] as const),
    );
    return Object.fromEntries(entries);
  }

  /** Every resequencer's open gaps and the age of its oldest, against its gap timeout, by name. */
  async gapStats(): Promise<Record<string, ResequencerGaps>> {
    const entries = await Promise.all(
      this.catalog
        .all()
        .map(async ({ resequencer }) => [resequencer.name, await resequencer.gapStats()] as const),
    );
    return Object.fromEntries(entries);
  }

  /** Calls `listener` for every gap alert, skip and dead-lettered event; returns the remover. */
  onGap(listener: GapListener): () => void {
    return this.gaps.add(listener);
  }

  /** The resequencer `name`; throws when there is none. */
  named(name: string): Resequencer {
    const entry = this.catalog.get(name);
    if (!entry) {
      const known = this.catalog.all().map((each) => each.resequencer.name);
      throw new RangeError(
        `no resequencer named ${name}; known: ${known.length > 0 ? known.join(', ') : 'none'}`,
      );
    }
    return entry.resequencer;
  }
}
