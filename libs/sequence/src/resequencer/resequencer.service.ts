import { Inject, Injectable, Logger } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { ResequencerRegistry } from '../discovery/resequencer.registry';
import { ResequencerMetrics } from '../observability/resequencer.metrics';
import type {
  OpenGap,
  ResequencerKeyState,
  ResequencerStore,
} from '../ports/resequencer-store.port';
import type { Disposition, Transport } from '../ports/transport.port';
import { SEQUENCE_OPTIONS, SEQUENCE_TRANSPORT } from '../sequence.constants';
import type { ResolvedSequenceOptions } from '../sequence.options';
import { GapReporter, type GapListener } from './gap.reporter';
import { Resequencer } from './resequencer';
import { RESEQUENCER_OPTIONS, RESEQUENCER_STORE } from './resequencer.constants';
import {
  resolveDefinition,
  type ResequencerDefinition,
  type ResolvedResequencerModuleOptions,
} from './resequencer.options';
import type { ResequencedEvent, ResequencerInput } from './resequenced-event';

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
export class ResequencerService {
  private readonly logger = new Logger('Resequencer');

  constructor(
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
    @Inject(RESEQUENCER_OPTIONS) private readonly options: ResolvedResequencerModuleOptions,
    @Inject(SEQUENCE_OPTIONS) private readonly sequenceOptions: ResolvedSequenceOptions,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly registry: ResequencerRegistry,
    private readonly metrics: ResequencerMetrics,
    private readonly gaps: GapReporter,
  ) {}

  /**
   * Defines a resequencer that the module does not consume for: feed it with `receive` and settle
   * each message as the returned disposition says. The module's gap sweeper covers it.
   * `handler` receives released events (unless only `output` is wanted).
   */
  create(
    definition: ResequencerDefinition,
    handler?: (event: ResequencedEvent) => unknown,
  ): Resequencer {
    return this.define('ResequencerService.create', definition, handler, false);
  }

  /** @internal The explorer's entry point for `@Resequenced` methods. */
  define(
    definedBy: string,
    definition: ResequencerDefinition,
    handler: ((event: ResequencedEvent) => unknown) | undefined,
    subscribed: boolean,
  ): Resequencer {
    const resolved = resolveDefinition(
      definedBy,
      definition,
      this.options,
      this.sequenceOptions,
      (channel) => this.transport.deadLetterChannel(channel),
    );
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
        module: this.options,
        sequence: this.sequenceOptions,
        metrics: this.metrics,
        logger: this.logger,
      },
      {
        handler,
        transport: this.transport,
        reportGap: (event) => this.gaps.report(event),
      },
    );
    this.registry.add({ definedBy, resequencer, subscribed });
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

  /** Calls `listener` for every gap alert, skip and dead-lettered event; returns the remover. */
  onGap(listener: GapListener): () => void {
    return this.gaps.add(listener);
  }

  /** The resequencer `name`; throws when there is none. */
  named(name: string): Resequencer {
    const entry = this.registry.get(name);
    if (!entry) {
      const known = this.registry.all().map((each) => each.resequencer.name);
      throw new RangeError(
        `no resequencer named ${name}; known: ${known.length > 0 ? known.join(', ') : 'none'}`,
      );
    }
    return entry.resequencer;
  }
}
