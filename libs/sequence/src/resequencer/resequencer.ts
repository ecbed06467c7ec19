import type { TraceSpan } from '../kernel/tracing/message-spans';
import { ResequencerTracing } from './resequencer.tracing';
import { claimCheckMarking } from '../core/claim-check-headers';
import { carriesFragmentHeaders } from '../core/headers';
import { type ResequencerInput } from '../core/resequence-input';
import { randomUUID } from 'node:crypto';
import type { Logger } from '@nestjs/common';
import { clockFrom, settlesWithin } from '../core/async';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { isTransportHeader, SequenceHeader, toHeaderValue, type HeaderMap } from '../core/headers';
import type { ResequencerMetrics } from './resequencer.metrics';
import type {
  DrainClaim,
  DrainContext,
  DrainSettlement,
  GapPolicy,
  GapStats,
  HandOffItem,
  OpenGap,
  ResequencedEntry,
  ResequencerKey,
  ResequencerKeyState,
  ResequencerStore,
} from '../ports/resequencer-store.port';
import { CLOSED_KEY_NEXT, heldEntryBytes } from '../ports/resequencer-store.port';
import { requeueCount, type Disposition } from '../ports/transport.port';
import { errorMessage } from '../core/errors/caught';
import { kindOf } from '../core/objects';
import { AbandonedCalls } from '../kernel/abandoned-calls';
import { leaseClock, type LeaseInstant } from '../core/lease-clock';
import { DrainLease } from './drain-lease';
import { HandOffDeliverer, type HandOffTargets } from './hand-off.deliverer';
import { LocalDrains } from './local-drains';
import type { ResolvedOptions, ResolvedResequencer } from '../options/resolved-options';
import { positionOf } from './resequencer-fields';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { ResequencerLifecycle } from './resequencer.events';

/** How a drain ended: the list emptied, another holder drains it, or delivery must wait. */
export type DrainResult = 'drained' | 'busy' | 'lost' | 'failed';

/** A drain whose first claim was already made (by the accept that released the events). */
interface StartedDrain {
  readonly holder: string;
  readonly claim: DrainClaim;
  /** When the call that made the claim was sent. */
  readonly claimedAt: LeaseInstant;
}

/** What a resequencer's buffers hold now against its scope-wide bounds. */
export interface ResequencerBuffers {
  /** Events buffered behind gaps, all keys together. */
  readonly events: number;
  /** `resequencer.maxBufferedTotal`. */
  readonly maxEvents: number;
  /** Their bytes (body, headers and 64 bytes each). */
  readonly bytes: number;
  /** `resequencer.maxBufferedBytesTotal`. */
  readonly maxBytes: number;
}

/** A resequencer's open gaps (`GapStats`) with the gap option they are judged against. */
export interface ResequencerGaps extends GapStats {
  /** `gap.timeoutMs`: how long a gap may stay open before `policy` applies. */
  readonly timeoutMs: number;
  readonly policy: GapPolicy;
}

/** What one sweep of one resequencer did. */
export interface ResequencerSweepReport {
  readonly gapsResolved: number;
  readonly stalledDrained: number;
}

export interface ResequencerDependencies {
  readonly store: ResequencerStore;
  readonly options: ResolvedOptions;
  readonly metrics: ResequencerMetrics;
  readonly logger: Logger;
  /** Where its gap events go; none: nobody hears them (a resequencer built by hand, in a test). */
  readonly events?: SequenceEvents;
}

const ACK: Disposition = { action: 'ack' };
/** Between two looks at a key another instance is draining (one of this process's wakes its waiters). */
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
  private readonly localDrains = new LocalDrains();
  /**
   * A key's drain keeps its lease until these end: its calls never overlap, on this instance or
   * another.
   */
  private readonly abandoned = new AbandonedCalls();
  /** Drains going on after their input was acked (see {@link drainFor}). */
  private readonly finishing = new Set<Promise<void>>();
  private readonly lifecycle: ResequencerLifecycle;
  /** `HandOffTargets.stop`: aborted at shutdown. */
  private readonly stop?: AbortSignal;

  constructor(
    readonly definition: ResolvedResequencer,
    private readonly deps: ResequencerDependencies,
    targets: Omit<HandOffTargets, 'definition' | 'publish' | 'metrics' | 'logger' | 'abandoned'>,
  ) {
    this.lifecycle = new ResequencerLifecycle(
      deps.events ?? new SequenceEvents(),
      definition.name,
      definition.channel,
    );
    this.deliverer = new HandOffDeliverer({
      ...targets,
      abandoned: this.abandoned,
      definition,
      publish: deps.options.publish,
      metrics: deps.metrics,
      logger: deps.logger,
      tracing: deps.options.tracing,
    });
    this.traces = new ResequencerTracing(deps.options.tracing, definition.name);
    this.stop = targets.stop;
  }

  private readonly traces: ResequencerTracing;

  get name(): string {
    return this.definition.name;
  }

  /** Takes one input message; never throws: every outcome is a disposition. */
  /**
   * Takes one message of the resequencer's channel (a `@Resequenced` handler's): a fragment of a
   * Message Sequence or a claim ticket is refused, since taken for an event it would be handed
   * over as if it were a whole payload; the rest as {@link receive}. Never throws.
   */
  async receiveFromChannel(message: ResequencerInput): Promise<Disposition> {
    const carried = carriedPayload(message.headers ?? {});
    if (!carried) return this.receive(message);
    this.deps.metrics.received(this.name, 'invalid');
    return this.reject(
      'invalid-resequence-event',
      `the message is ${carried}, not an event: send each resequenced event in one message`,
    );
  }

  receive(message: ResequencerInput): Promise<Disposition> {
    return this.traces.hold(message.headers, (span) => this.take(message, span));
  }

  private async take(message: ResequencerInput, span: TraceSpan): Promise<Disposition> {
    const { definition, deps } = this;
    const position = positionOf(message, definition.key, definition.seq);
    if (!position.ok) {
      deps.metrics.received(this.name, 'invalid');
      return this.reject('invalid-resequence-event', position.problem);
    }
    const { key, seq } = position;
    if (seq < definition.start) {
      // No event of a key comes before its first: taken for a late one, it would be acked and
      // dropped, unseen (a producer counting from 0 would lose every key's first event).
      deps.metrics.received(this.name, 'invalid');
      return this.reject(
        'invalid-resequence-event',
        `key ${key}, event ${seq}: below ${definition.start}, the first sequence number of every key (start)`,
        { key, seq },
      );
    }
    const body = asBuffer(message.body);
    if (!body) {
      deps.metrics.received(this.name, 'invalid');
      return this.reject(
        'invalid-resequence-event',
        `key ${key}, event ${seq}: the body must be a Buffer or a Uint8Array, got ${kindOf(message.body)}`,
      );
    }
    // Whoever releases drains: the lease comes with the release, in the same store step.
    const holder = this.newHolder();
    const claimedAt = leaseClock();
    const entry = {
      seq,
      body,
      headers: ResequencerTracing.stored(span, entryHeaders(message.headers), key, seq),
    };
    let outcome;
    try {
      outcome = await deps.store.accept(this.ref(key), entry, {
        start: definition.start,
        limits: {
          maxBufferedPerKey: definition.maxBufferedPerKey,
          maxBufferedTotal: deps.options.resequencer.maxBufferedTotal,
          maxBufferedBytesPerKey: definition.maxBufferedBytesPerKey,
          maxBufferedBytesTotal: definition.maxBufferedBytesTotal,
          maxSeqAhead: definition.maxSeqAhead,
        },
        now: Date.now(),
        drain: {
          holder,
          leaseMs: deps.options.tuning.leaseMs,
          limit: deps.options.tuning.drain.batchSize,
        },
      });
    } catch (error) {
      deps.logger.warn(
        `${this.name}: the ${deps.store.name} store failed on key ${key}; requeued: ${errorMessage(error)}`,
      );
      // The step may have run and claimed the lease before failing (an index step on Redis
      // Cluster): give it back, so the redelivery does not wait leaseMs for it.
      void deps.store.releaseDrain(this.ref(key), holder).catch(() => undefined);
      return this.requeue('resequencer store unavailable');
    }
    deps.metrics.received(this.name, outcome.kind);
    this.lifecycle.accepted(key, seq, outcome);
    switch (outcome.kind) {
      case 'buffered':
      case 'duplicate':
        return ACK;
      case 'late': {
        const closed = definition.closeAfterDeadLetter;
        if (closed !== undefined && outcome.next >= CLOSED_KEY_NEXT) {
          // A key closed when its gap's events were dead-lettered: this one goes the same way
          // (a drain the accept may have claimed for what is left is given back).
          if (outcome.drain)
            void deps.store.releaseDrain(this.ref(key), holder).catch(() => undefined);
          return this.reject(
            closed,
            `key ${key}, event ${seq}: the key was closed when the events behind its gap were dead-lettered`,
            { key, seq },
          );
        }
        return outcome.pending
          ? this.drainFor(key, { holder, claim: outcome.drain, claimedAt })
          : ACK;
      }
      case 'released':
        return this.drainFor(key, { holder, claim: outcome.drain, claimedAt });
      case 'full': {
        if (seq === outcome.next) {
          // Refused only while the key's released events wait in its hand-off list: drained
          // here, so that this event finds room when it comes again. Nothing else might drain
          // the list: a settle that failed after its input was acked leaves it to the next one.
          await this.drainQuietly(key);
          return this.requeue(
            `key ${key}, event ${seq}: ${outcome.limit} reached while its released events wait to be delivered`,
          );
        }
        if (outcome.limit === 'maxSeqAhead') {
          // Dead-lettered whatever `overflow` says: waiting does not bring a bogus sequence number
          // within reach (refused, it opens no gap for a policy to move the key past), so a
          // requeue would bring it back for ever.
          const detail =
            `key ${key}, event ${seq}: more than maxSeqAhead (${definition.maxSeqAhead}) past ` +
            `${outcome.next}, the next expected`;
          return this.reject('invalid-resequence-event', detail, { key, seq });
        }
        const detail = `key ${key}, event ${seq}: ${outcome.limit} reached while waiting for ${outcome.next}`;
        if (definition.overflow === 'dead-letter') {
          return this.reject('resequencer-buffer-full', detail, { key, seq });
        }
        if (this.waitedInVain(outcome.limit, entry, message)) {
          return this.reject(
            'resequencer-buffer-full',
            `${detail}; larger than that budget on its own, it could only be taken after ` +
              `${outcome.next}, which did not come within gap.timeoutMs (${definition.gap.timeoutMs} ms)`,
            { key, seq },
          );
        }
        return this.requeue(detail);
      }
    }
  }

  /**
   * Whether an early event refused at `limit` can only ever be taken in order (it is larger than
   * that budget on its own: no buffer takes it, so no gap opens behind it for a policy to act
   * on), and has come back for `gap.timeoutMs` already, counted in requeues
   * `tuning.backpressureDelayMs` apart: requeued again, it would come back for ever were the
   * events before it lost.
   */
  private waitedInVain(limit: string, entry: ResequencedEntry, message: ResequencerInput): boolean {
    const { definition, deps } = this;
    const budget =
      limit === 'maxBufferedBytesPerKey'
        ? definition.maxBufferedBytesPerKey
        : limit === 'maxBufferedBytesTotal'
          ? definition.maxBufferedBytesTotal
          : undefined;
    if (budget === undefined || heldEntryBytes(entry) <= budget) return false;
    const waitedMs = requeueCount(message.headers ?? {}) * deps.options.tuning.backpressureDelayMs;
    return waitedMs >= definition.gap.timeoutMs;
  }

  /**
   * Delivers what waits in `key`'s hand-off list, in order, until it is empty. Answers `busy`
   * without delivering when another holder's lease is live.
   *
   * `onCovered` is called (once at most) as soon as every item the list held when this drain
   * began is delivered, before the settle that trims them: a claim of fewer than
   * `tuning.drain.batchSize` items is the whole list, so once they are delivered, so is every
   * event appended before it was made. The drain then goes on (settle, and whatever was appended
   * meanwhile).
   */
  async drain(key: string, started?: StartedDrain, onCovered?: () => void): Promise<DrainResult> {
    const { store, options, logger } = this.deps;
    const { leaseMs, drain } = options.tuning;
    const ref = this.ref(key);
    const holder = started?.holder ?? this.newHolder();
    const context = (): DrainContext => ({
      holder,
      leaseMs,
      limit: drain.batchSize,
      now: Date.now(),
    });
    // A handler call abandoned on this key still runs here: the drain that abandoned it holds
    // the key until it returns (below), and a new one must not start behind its back.
    if (!started && this.abandoned.has(key)) return 'busy';
    const claimedAt = started?.claimedAt ?? leaseClock();
    let claim: DrainSettlement;
    try {
      claim = started?.claim ?? (await store.claimDrain(ref, context()));
    } catch (error) {
      // The claim may have been taken before it failed (abandoned unanswered, say): give it
      // back, so that the key's next drain does not wait leaseMs for it.
      void store.releaseDrain(ref, holder).catch(() => undefined);
      throw error;
    }
    if (claim.kind !== 'claimed') return claim.kind === 'empty' ? 'drained' : 'busy';
    const lease = new DrainLease(store, ref, holder, leaseMs, claimedAt, logger);
    // Whether this drain handed over what ends the key (see IntakeBounds.retire).
    let ended = false;
    this.localDrains.begin(key);
    try {
      while (claim.kind === 'claimed') {
        const { items } = claim;
        let delivered = 0;
        while (delivered < items.length && !lease.lost()) {
          const count = await this.deliverer.deliverFrom(key, items, delivered, lease);
          if (count === 0) break;
          if (this.definition.retire) {
            for (let i = delivered; i < delivered + count && !ended; i++) {
              ended = this.ends(key, items[i]);
            }
          }
          delivered += count;
        }
        // Before the settle that may let the lease go: while a call this drain abandoned still
        // runs, the key's next event must not be delivered, here or on another instance. The
        // lease is renewed meanwhile.
        await this.abandoned.settled(key);
        await lease.pause();
        if (delivered < items.length || lease.lost()) {
          // Stopped early (broker unreachable, or the lease may be gone): settle what went out
          // (the store refuses if another holder has the lease now), and let the lease go.
          if (delivered > 0) await store.settleDrain(ref, delivered, context());
          await store.releaseDrain(ref, holder);
          if (lease.lost()) {
            logger.warn(`${this.name}: stopped draining key ${key}: its lease ran out (leaseMs)`);
          }
          return lease.lost() ? 'lost' : 'failed';
        }
        if (onCovered && items.length < drain.batchSize) {
          onCovered();
          onCovered = undefined;
        }
        const sentAt = leaseClock();
        claim = await store.settleDrain(ref, items.length, context());
        if (claim.kind === 'claimed') lease.confirmed(sentAt);
        lease.resume();
      }
    } catch (error) {
      // A store or decode failure mid-drain: let the lease go now rather than block the key
      // for leaseMs (but not before an abandoned call of the key returned); the items stay for
      // the next drain.
      await this.abandoned.settled(key);
      await store.releaseDrain(ref, holder).catch(() => undefined);
      throw error;
    } finally {
      lease.stop();
      this.localDrains.end(key);
    }
    if (claim.kind === 'lost') {
      logger.warn(`${this.name}: lost the drain lease of key ${key} (slower than leaseMs?)`);
    }
    // Emptied after what ended the key: its state need not outlive the definer's horizon.
    if (claim.kind === 'empty' && ended) await this.retire(key, this.definition.retire!.afterMs);
    return claim.kind === 'empty' ? 'drained' : claim.kind;
  }

  /**
   * One gap sweep: applies the policy to due gaps, then drains stalled hand-off lists.
   * `stopping` is asked between keys (a shutdown does not wait for a whole batch).
   */
  async sweep(
    now: number = Date.now(),
    stopping: () => boolean = () => false,
  ): Promise<ResequencerSweepReport> {
    const { store, options, logger } = this.deps;
    const { leaseMs } = options.tuning;
    const { batchSize } = options.tuning.sweepers.gaps;
    const { policy, timeoutMs } = this.definition.gap;
    const openedBefore = now - timeoutMs;
    // The sweep's clock moves on while it drains one key after another: a gap that a skip leaves
    // open dates from when its key was resolved, or it would be acted on before its timeout.
    const clock = clockFrom(now);
    let gapsResolved = 0;
    // An alerted gap is due again under any other policy: instances of the resequencer may
    // still alert (a rolling deploy), or the policy was 'alert' when the gap timed out.
    const alertedToo = policy !== 'alert';
    for (const gap of await store.listGaps(this.name, openedBefore, batchSize, alertedToo)) {
      if (stopping()) return { gapsResolved, stalledDrained: 0 };
      const resolution = await store.resolveGap(this.ref(gap.key), policy, {
        openedBefore,
        now: clock(),
        close: this.definition.closeAfterDeadLetter !== undefined,
      });
      if (resolution.kind === 'none') continue; // another instance was first, or it filled
      const why = `past gap.timeoutMs (${timeoutMs} ms)`;
      this.lifecycle.resolved(gap, resolution, why, clock());
      gapsResolved++;
      await this.drainFromSweep(gap.key);
    }
    gapsResolved += await this.rescueExpiring(now, clock, stopping);
    const stalled = await store.listStalledHandOffs(this.name, now - leaseMs, batchSize);
    let stalledDrained = 0;
    for (const key of stalled) {
      if (stopping()) break;
      await this.drainFromSweep(key);
      stalledDrained++;
    }
    try {
      await this.buffers();
    } catch (error) {
      logger.warn(`${this.name}: could not read the buffered totals: ${errorMessage(error)}`);
    }
    return { gapsResolved, stalledDrained };
  }

  /**
   * Keys that retention would soon delete with the events held behind their gap (an alerted gap
   * nobody resolved, a timeout longer than the retention): their events are dead-lettered
   * instead, unless the key changed since it was listed. A failure is logged: the rest of the
   * sweep (stalled hand-offs) still runs.
   */
  private async rescueExpiring(
    now: number,
    clock: () => number,
    stopping: () => boolean,
  ): Promise<number> {
    const { store, options, logger } = this.deps;
    let rescued = 0;
    try {
      const listed = await store.listExpiringGaps(
        this.name,
        now,
        options.tuning.sweepers.gaps.batchSize,
      );
      for (const gap of listed) {
        if (stopping()) break;
        const at = clock();
        // openedBefore on the caller's clock, like every time passed in; the listing's
        // changedAt is the store's own record of the key's last change.
        const resolution = await store.resolveGap(this.ref(gap.key), 'dead-letter', {
          openedBefore: at,
          now: at,
          unchangedSince: gap.changedAt,
          close: this.definition.closeAfterDeadLetter !== undefined,
        });
        if (resolution.kind === 'none') continue;
        logger.warn(
          `${this.name}: key ${gap.key} held ${gap.buffered} event(s) behind its gap ` +
            `(${gap.expected} missing) with no change for nine tenths of the store's retention: ` +
            'dead-lettered them before retention would delete them',
        );
        const why = "with no change to the key for nine tenths of the store's retention";
        this.lifecycle.resolved(gap, resolution, why, clock());
        rescued++;
        await this.drainFromSweep(gap.key);
      }
    } catch (error) {
      logger.warn(
        `${this.name}: could not dead-letter the gaps close to retention; the next sweep ` +
          `retries: ${errorMessage(error)}`,
      );
    }
    return rescued;
  }

  /** What the buffers hold now against the scope-wide bounds (the gauges are set to it). */
  async buffers(): Promise<ResequencerBuffers> {
    const { store, options, metrics } = this.deps;
    const [events, bytes] = await Promise.all([
      store.bufferedTotal(this.name),
      store.bufferedBytes(this.name),
    ]);
    metrics.bufferedNow(this.name, events, bytes);
    const { maxBufferedTotal } = options.resequencer;
    const maxBytes = this.definition.maxBufferedBytesTotal;
    return { events, maxEvents: maxBufferedTotal, bytes, maxBytes };
  }

  /** How many keys wait on a gap now and how long the oldest has, against `gap.timeoutMs`. */
  async gapStats(): Promise<ResequencerGaps> {
    const stats = await this.deps.store.gapStats(this.name, Date.now());
    return { ...stats, ...this.definition.gap };
  }

  /** The key's next expected sequence, buffered sequences and hand-off backlog. */
  inspect(key: string): Promise<ResequencerKeyState> {
    return this.deps.store.inspect(this.ref(key), this.definition.start);
  }

  /** Keys waiting on a gap now, oldest first, alerted ones included (`alerted: true`). */
  openGaps(limit = 100): Promise<OpenGap[]> {
    return this.deps.store.listGaps(this.name, Date.now(), limit, true);
  }

  /**
   * Skips the key's gap now, as the `'skip'` gap policy does when a gap times out (an operator's
   * action): the missing sequences are given up (a `gap-skipped` item, reported as that policy's
   * are), the run held behind them is released and drained. Answers the hand-off items the skip
   * appended, the `gap-skipped` item and the events released (so at least 2), or 0 when the key
   * had no gap, or none opened at or before `openedBefore` (the one an operator saw has filled,
   * and another opened since).
   */
  async skipGap(key: string, now: number = Date.now(), openedBefore = now): Promise<number> {
    const resolution = await this.deps.store.resolveGap(this.ref(key), 'skip', {
      openedBefore: Math.min(openedBefore, now),
      now,
    });
    if (resolution.kind === 'none') return 0;
    if (resolution.policy === 'skip') {
      this.lifecycle.skippedByOperator(key, resolution.skipped, now);
    }
    await this.drainQuietly(key);
    return resolution.appended;
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
   * A sweep's drain of `key`: waited for up to `tuning.drain.waitMs`, then left to go on in the
   * background (waited for at shutdown, as {@link settled} says), so that a slow or hung handler
   * on one key holds up no other key's gap, on this resequencer or the next.
   */
  private async drainFromSweep(key: string): Promise<void> {
    const draining = this.drainQuietly(key);
    // Tracked from the start: a shutdown that asks meanwhile waits for it too.
    this.keepUntilSettled(draining);
    await settlesWithin(draining, this.deps.options.tuning.drain.waitMs);
  }

  /**
   * Drains for an input message whose event was released (or may still be waiting to be),
   * starting from the claim its accept made, if any.
   */
  private async drainFor(key: string, first: Partial<StartedDrain>): Promise<Disposition> {
    const deadline = Date.now() + this.deps.options.tuning.drain.waitMs;
    let started: StartedDrain | undefined =
      first.claim && first.holder && first.claimedAt !== undefined
        ? { holder: first.holder, claim: first.claim, claimedAt: first.claimedAt }
        : undefined;
    for (;;) {
      let result: DrainResult | 'covered';
      try {
        // Acked once its event is delivered (confirmed on the output, or handled): the settle
        // that trims the delivered items, and the rest of the drain, go on without holding the
        // input's prefetch slot. A crash before the settle leaves delivered items in the list:
        // the key's next drain delivers them again, in order (at least once, as after any crash
        // mid-delivery).
        let covered!: () => void;
        const coveredNow = new Promise<'covered'>(
          (resolve) => (covered = () => resolve('covered')),
        );
        const running = this.drain(key, started, covered);
        started = undefined;
        result = await Promise.race([running, coveredNow]);
        if (result === 'covered') {
          this.finishInBackground(key, running);
          return ACK;
        }
      } catch (error) {
        this.deps.logger.warn(
          `${this.name}: draining key ${key} failed; requeued: ${errorMessage(error)}`,
        );
        return this.requeue('resequencer store unavailable');
      }
      if (result === 'drained') return ACK;
      if (result === 'failed') {
        // Stopping, the deliverer starts no publish or handler call: nothing was unreachable.
        const why = this.stop?.aborted ? 'the resequencer is stopping' : 'output unreachable';
        return this.requeue(`key ${key}: ${why}`);
      }
      // busy or lost: another drainer is delivering this key; its drain covers our event.
      const now = Date.now();
      if (now >= deadline) return this.requeue(`key ${key} is being drained elsewhere`);
      await this.localDrains.wait(key, BUSY_POLL_MS, deadline - now);
    }
  }

  /**
   * Resolves once the drains going on in the background have ended: those whose inputs were
   * acked before their settle (an input is acked once its run is delivered, and the trim
   * follows), and those a sweep stopped waiting for. At shutdown, before the store's connection
   * closes.
   */
  async settled(): Promise<void> {
    while (this.finishing.size > 0) await Promise.all([...this.finishing]);
  }

  /** The rest of a drain whose input was acked: its settle, and what came meanwhile. */
  private finishInBackground(key: string, running: Promise<DrainResult>): void {
    this.keepUntilSettled(
      running.then(
        () => undefined,
        (error: unknown) =>
          this.deps.logger.warn(
            `${this.name}: could not settle key ${key} after delivering it; the key's next ` +
              `drain delivers the unsettled items again: ${errorMessage(error)}`,
          ),
      ),
    );
  }

  /** Tracks `finishing` (which never rejects) until it ends, for {@link settled}. */
  private keepUntilSettled(finishing: Promise<void>): void {
    this.finishing.add(finishing);
    void finishing.finally(() => this.finishing.delete(finishing));
  }

  private newHolder(): string {
    return `${this.deps.options.consumerId}:${randomUUID()}`;
  }

  private ref(key: string): ResequencerKey {
    return { scope: this.name, key };
  }

  /** An input event dead-lettered; `event` when its key and sequence could be read. */
  private reject(code: RejectionCode, detail: string, event?: { key: string; seq: number }) {
    this.deps.metrics.deadLettered(this.name, code);
    const reason = deathReason(code, detail);
    this.deps.logger.warn(`${this.name}: dead-lettered an input event: ${reason}`);
    if (event) this.definition.deadLettered?.(event.key, event.seq, code, detail);
    return { action: 'dead-letter', reason } as const;
  }

  /**
   * Whether `item`, handed over, ends its key (see `IntakeBounds.retire`): an event the definer
   * says ends it, or an event dead-lettered when the key closed.
   */
  private ends(key: string, item: HandOffItem): boolean {
    const { retire, closeAfterDeadLetter } = this.definition;
    if (!retire) return false;
    if (item.kind === 'event') return retire.ends(key, item.entry);
    return item.kind === 'dead-letter' && closeAfterDeadLetter !== undefined;
  }

  /**
   * Lets the state of a key that ended, and was drained, expire after `retire.afterMs` rather
   * than the store's retention. A failure leaves it the store's retention: logged, not thrown.
   */
  private async retire(key: string, afterMs: number): Promise<void> {
    try {
      const now = Date.now();
      await this.deps.store.retire(this.ref(key), afterMs, now);
      this.definition.retire?.retired?.(key, now + afterMs);
    } catch (error) {
      this.deps.logger.warn(
        `${this.name}: key ${key} ended, but the ${this.deps.store.name} store could not let ` +
          `it go early; it is kept for the store's retention: ${errorMessage(error)}`,
      );
    }
  }

  private requeue(reason: string): Disposition {
    return { action: 'requeue', delayMs: this.deps.options.tuning.backpressureDelayMs, reason };
  }
}

/** The headers an event keeps: what the wire can carry, without the transport's own. */
function entryHeaders(headers: Readonly<Record<string, unknown>>): HeaderMap {
  const kept: HeaderMap = {};
  for (const [name, raw] of Object.entries(headers ?? {})) {
    if (isTransportHeader(name) || name === SequenceHeader.deathReason) continue;
    const value = toHeaderValue(raw);
    // NaN and the infinities cannot travel (JSON in the Redis store, AMQP field tables).
    if (value === undefined || (typeof value === 'number' && !Number.isFinite(value))) continue;
    kept[name] = value;
  }
  return kept;
}

/**
 * The body as a Buffer: a Uint8Array (or another view) from a subscriber of your own is wrapped
 * without a copy; anything else is not a body (a store would refuse it, or store it otherwise).
 */
function asBuffer(body: unknown): Buffer | undefined {
  if (Buffer.isBuffer(body)) return body;
  if (ArrayBuffer.isView(body)) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  return undefined;
}

/** What a message that is not an event on its own carries, if it is one: see the wire contract. */
function carriedPayload(headers: Readonly<Record<string, unknown>>): string | undefined {
  if (carriesFragmentHeaders(headers)) {
    return 'a fragment of a Message Sequence (it has x-sequence-* or x-fragment-* headers)';
  }
  if (claimCheckMarking(headers).via === 'ticket') return 'a claim ticket (x-claim-check: 1)';
  return undefined;
}
