import { randomUUID } from 'node:crypto';
import type { Logger } from '@nestjs/common';
import { delay } from '../core/async';
import { deathReason } from '../core/errors/rejection-code';
import { isTransportHeader, SequenceHeader, toHeaderValue, type HeaderMap } from '../core/headers';
import type { ResequencerMetrics } from '../observability/resequencer.metrics';
import type {
  DrainClaim,
  DrainContext,
  DrainSettlement,
  OpenGap,
  ResequencerKey,
  ResequencerKeyState,
  ResequencerStore,
} from '../ports/resequencer-store.port';
import type { Disposition } from '../ports/transport.port';
import { errorMessage } from '../sequence/sequence-delivery';
import type { ResolvedSequenceOptions } from '../sequence.options';
import { HandOffDeliverer, type HandOffTargets } from './hand-off.deliverer';
import type { ResolvedResequencer, ResolvedResequencerModuleOptions } from './resequencer.options';
import { positionOf } from './resequencer-fields';
import type { ResequencerInput } from './resequenced-event';

/** How a drain ended: the list emptied, another holder drains it, or delivery must wait. */
export type DrainResult = 'drained' | 'busy' | 'lost' | 'failed';

/** A drain whose first claim was already made (by the accept that released the events). */
interface StartedDrain {
  readonly holder: string;
  readonly claim: DrainClaim;
}

interface LeaseRenewal {
  lost(): boolean;
  pause(): Promise<void>;
  resume(): void;
  stop(): void;
}

/** What one sweep of one resequencer did. */
export interface ResequencerSweepReport {
  readonly gapsResolved: number;
  readonly stalledDrained: number;
}

export interface ResequencerDependencies {
  readonly store: ResequencerStore;
  readonly module: ResolvedResequencerModuleOptions;
  readonly sequence: ResolvedSequenceOptions;
  readonly metrics: ResequencerMetrics;
  readonly logger: Logger;
}

const ACK: Disposition = { action: 'ack' };
/** Between two looks at a key another instance is draining. */
const BUSY_POLL_MS = 10;

/**
 * One resequencer at work: takes input events (`receive`), hands each key's events on in strict
 * sequence order (`drain`), and applies the gap policy (`sweep`). Any number of instances may run
 * the same resequencer over one shared store: every step on a key is atomic in the store, and a
 * key's hand-off list has one drainer at a time.
 *
 * An input message is acked once its event is buffered, dropped as a duplicate, or delivered (the
 * drain that delivered it has settled); while another instance drains the key it waits up to
 * `drainWaitMs`, then requeues its message with a delay so that it checks again later. A store
 * that fails requeues the message: nothing is acked that the store does not hold.
 */
export class Resequencer {
  private readonly deliverer: HandOffDeliverer;

  constructor(
    readonly definition: ResolvedResequencer,
    private readonly deps: ResequencerDependencies,
    targets: Omit<HandOffTargets, 'definition' | 'publish' | 'metrics' | 'logger'>,
  ) {
    this.deliverer = new HandOffDeliverer({
      ...targets,
      definition,
      publish: deps.sequence.publish,
      metrics: deps.metrics,
      logger: deps.logger,
    });
  }

  get name(): string {
    return this.definition.name;
  }

  /** Takes one input message; never throws: every outcome is a disposition. */
  async receive(message: ResequencerInput): Promise<Disposition> {
    const { definition, deps } = this;
    const position = positionOf(message, definition.key, definition.seq);
    if (!position.ok) {
      deps.metrics.received(this.name, 'invalid');
      return this.reject('invalid-resequence-event', position.problem);
    }
    const { key, seq } = position;
    // Whoever releases drains: the lease comes with the release, in the same store step.
    const holder = this.newHolder();
    let outcome;
    try {
      outcome = await deps.store.accept(
        this.ref(key),
        { seq, body: message.body, headers: entryHeaders(message.headers) },
        {
          start: definition.start,
          limits: {
            maxBufferedPerKey: definition.maxBufferedPerKey,
            maxBufferedTotal: deps.module.maxBufferedTotal,
          },
          now: Date.now(),
          drain: { holder, leaseMs: deps.sequence.leaseMs, limit: deps.module.drainBatch },
        },
      );
    } catch (error) {
      deps.logger.warn(
        `${this.name}: the ${deps.store.name} store failed on key ${key}; requeued: ${errorMessage(error)}`,
      );
      return this.requeue('resequencer store unavailable');
    }
    deps.metrics.received(this.name, outcome.kind);
    switch (outcome.kind) {
      case 'buffered':
      case 'duplicate':
        return ACK;
      case 'late':
        return outcome.pending ? this.drainFor(key, { holder, claim: outcome.drain }) : ACK;
      case 'released':
        return this.drainFor(key, { holder, claim: outcome.drain });
      case 'full': {
        const detail = `key ${key}, event ${seq}: ${outcome.limit} reached while waiting for ${outcome.next}`;
        if (definition.overflow === 'dead-letter') {
          return this.reject('resequencer-buffer-full', detail);
        }
        return this.requeue(detail);
      }
    }
  }

  /**
   * Delivers what waits in `key`'s hand-off list, in order, until it is empty. Answers `busy`
   * without delivering when another holder's lease is live.
   */
  async drain(key: string, started?: StartedDrain): Promise<DrainResult> {
    const { store, sequence, module, logger } = this.deps;
    const ref = this.ref(key);
    const holder = started?.holder ?? this.newHolder();
    const context = (): DrainContext => ({
      holder,
      leaseMs: sequence.leaseMs,
      limit: module.drainBatch,
      now: Date.now(),
    });
    let claim: DrainSettlement = started?.claim ?? (await store.claimDrain(ref, context()));
    if (claim.kind !== 'claimed') return claim.kind === 'empty' ? 'drained' : 'busy';
    const renewal = this.keepLease(ref, holder);
    try {
      while (claim.kind === 'claimed') {
        const { items } = claim;
        let delivered = 0;
        while (delivered < items.length && !renewal.lost()) {
          if (!(await this.deliverer.deliver(key, items[delivered]))) break;
          delivered++;
        }
        await renewal.pause();
        if (delivered < items.length || renewal.lost()) {
          // Stopped early (broker unreachable, or the lease was lost): settle what went out.
          if (delivered > 0 && !renewal.lost()) await store.settleDrain(ref, delivered, context());
          await store.releaseDrain(ref, holder);
          return renewal.lost() ? 'lost' : 'failed';
        }
        claim = await store.settleDrain(ref, items.length, context());
        renewal.resume();
      }
    } finally {
      renewal.stop();
    }
    if (claim.kind === 'lost') {
      logger.warn(`${this.name}: lost the drain lease of key ${key} (slower than leaseMs?)`);
    }
    return claim.kind === 'empty' ? 'drained' : claim.kind;
  }

  /** One gap sweep: applies the policy to due gaps, then drains stalled hand-off lists. */
  async sweep(now: number = Date.now()): Promise<ResequencerSweepReport> {
    const { store, module, sequence, metrics, logger } = this.deps;
    const { policy, timeoutMs } = this.definition.gap;
    const openedBefore = now - timeoutMs;
    let gapsResolved = 0;
    for (const gap of await store.listGaps(this.name, openedBefore, module.sweepBatch)) {
      const resolution = await store.resolveGap(this.ref(gap.key), policy, { openedBefore, now });
      if (resolution.kind === 'none') continue; // another instance was first, or it filled
      gapsResolved++;
      await this.drainQuietly(gap.key);
    }
    const stalled = await store.listStalledHandOffs(
      this.name,
      now - sequence.leaseMs,
      module.sweepBatch,
    );
    for (const key of stalled) await this.drainQuietly(key);
    try {
      metrics.bufferedNow(this.name, await store.bufferedTotal(this.name));
    } catch (error) {
      logger.warn(`${this.name}: could not read the buffered total: ${errorMessage(error)}`);
    }
    return { gapsResolved, stalledDrained: stalled.length };
  }

  /** The key's next expected sequence, buffered sequences and hand-off backlog. */
  inspect(key: string): Promise<ResequencerKeyState> {
    return this.deps.store.inspect(this.ref(key), this.definition.start);
  }

  /** Keys waiting on a gap now, oldest first (alerted ones included only when due). */
  openGaps(limit = 100): Promise<OpenGap[]> {
    return this.deps.store.listGaps(this.name, Date.now(), limit);
  }

  private async drainQuietly(key: string): Promise<void> {
    try {
      await this.drain(key);
    } catch (error) {
      this.deps.logger.warn(
        `${this.name}: could not drain key ${key}; the next sweep retries: ${errorMessage(error)}`,
      );
    }
  }

  /**
   * Drains for an input message whose event was released (or may still be waiting to be),
   * starting from the claim its accept made, if any.
   */
  private async drainFor(key: string, first: Partial<StartedDrain>): Promise<Disposition> {
    const deadline = Date.now() + this.deps.module.drainWaitMs;
    let started: StartedDrain | undefined =
      first.claim && first.holder ? { holder: first.holder, claim: first.claim } : undefined;
    for (;;) {
      let result: DrainResult;
      try {
        result = await this.drain(key, started);
        started = undefined;
      } catch (error) {
        this.deps.logger.warn(
          `${this.name}: draining key ${key} failed; requeued: ${errorMessage(error)}`,
        );
        return this.requeue('resequencer store unavailable');
      }
      if (result === 'drained') return ACK;
      if (result === 'failed') return this.requeue(`key ${key}: output unreachable`);
      // busy or lost: another instance is delivering this key; its drain covers our event.
      if (Date.now() >= deadline) return this.requeue(`key ${key} is being drained elsewhere`);
      await delay(BUSY_POLL_MS);
    }
  }

  /**
   * Renews the drain lease every third of `leaseMs` while a drain delivers. A renewal that finds
   * the lease gone (another instance took it over after it lapsed: this one was stalled) marks it
   * lost, and the drain stops before its next item. Renewal pauses around each settle, so that
   * an in-flight renewal never races the settle that releases the lease.
   */
  private keepLease(ref: ResequencerKey, holder: string): LeaseRenewal {
    const { store, sequence, logger } = this.deps;
    let lost = false;
    let paused = false;
    let inFlight: Promise<void> = Promise.resolve();
    const timer = setInterval(
      () => {
        if (paused || lost) return;
        inFlight = store.renewDrain(ref, holder, sequence.leaseMs, Date.now()).then(
          (renewed) => {
            if (!renewed) lost = true;
          },
          (error: unknown) =>
            logger.warn(
              `${this.name}: could not renew the drain lease of ${ref.key}: ${errorMessage(error)}`,
            ),
        );
      },
      Math.max(50, Math.floor(sequence.leaseMs / 3)),
    );
    timer.unref();
    return {
      lost: () => lost,
      pause: async () => {
        paused = true;
        await inFlight;
      },
      resume: () => {
        paused = false;
      },
      stop: () => clearInterval(timer),
    };
  }

  private newHolder(): string {
    return `${this.deps.sequence.consumerId}:${randomUUID()}`;
  }

  private ref(key: string): ResequencerKey {
    return { scope: this.name, key };
  }

  private reject(code: 'invalid-resequence-event' | 'resequencer-buffer-full', detail: string) {
    this.deps.metrics.deadLettered(this.name, code);
    const reason = deathReason(code, detail);
    this.deps.logger.warn(`${this.name}: dead-lettered an input event: ${reason}`);
    return { action: 'dead-letter', reason } as const;
  }

  private requeue(reason: string): Disposition {
    return { action: 'requeue', delayMs: this.deps.sequence.backpressureDelayMs, reason };
  }
}

/** The headers an event keeps: what the wire can carry, without the transport's own. */
function entryHeaders(headers: Readonly<Record<string, unknown>>): HeaderMap {
  const kept: HeaderMap = {};
  for (const [name, raw] of Object.entries(headers ?? {})) {
    if (isTransportHeader(name) || name === SequenceHeader.deathReason) continue;
    const value = toHeaderValue(raw);
    if (value !== undefined) kept[name] = value;
  }
  return kept;
}
