import { ConsumerHost } from '../../kernel/consumer.host';
import { Inject, Injectable, Logger, type OnModuleDestroy } from '@nestjs/common';
import { MAX_TIMER_MS } from '../../core/async';
import { sha256Hasher } from '../../core/checksum';
import { claimCheckMarking } from '../../core/claim-check-headers';
import { admitFragment, recordFragment } from '../../core/completeness';
import { errorMessage } from '../../core/errors/caught';
import {
  deathReason,
  splitDeathReason,
  type RejectionCode,
} from '../../core/errors/rejection-code';
import { SequenceIntegrityError } from '../../core/errors/sequence-integrity.error';
import { StoredFragmentIntegrityError } from '../../core/errors/stored-fragment-integrity.error';
import { parseFragmentHeaders, type FragmentHeaders } from '../../core/headers';
import { partitionIndex } from '../../core/partition';
import { deadLetterReasonLabel } from '../../kernel/dead-letter.metrics';
import { handlerRejection } from '../../kernel/handler-retry';
import { SequenceEvents } from '../../kernel/lifecycle-events';
import { RESOLVED_OPTIONS, BOUNDED_SEQUENCE_STORE } from '../../kernel/tokens';
import type { ResolvedOptions } from '../../options/resolved-options';
import { DEFAULT_SPOOL_DIR } from '../../options/resolve-sequence';
import type {
  ExpiredSequence,
  FinishedOutcome,
  SequenceRef,
  SequenceStore,
} from '../../ports/sequence-store.port';
import type { Disposition, InboundMessage } from '../../ports/transport.port';
import { AggregatorService } from '../aggregator.service';
import { FragmentChecks, isRefusal } from '../fragment-checks';
import type { PayloadDigest } from '../intake-digests';
import { ReassembledPayload } from '../reassembled-payload';
import { matches, runSequenceHandler } from '../sequence-delivery';
import type { SequenceConsumer } from '../sequence-consumer';
import { SequenceLifecycle } from '../sequence.events';
import { SequenceMetrics } from '../sequence.metrics';
import { SequenceTracing } from '../sequence.tracing';
import { HeldSequence, type HeldFragment } from './held-sequence';
import { Spool, type SpoolFile } from './spool';

const ACK: Disposition = { action: 'ack' };
/** Why a fragment whose delivery its subscription lost is handed back. */
const NOT_HELD_HERE = 'no longer held by this consumer';

/** Where a sequence this consumer is not holding goes; `startedAt`: when it began here, if it moved. */
type Route = { readonly to: 'store'; readonly until: number; readonly startedAt?: number };

/** Sequences at once remembered as going through the store (oldest forgotten first). */
const STORE_ROUTES = 10_000;
/** Sequences at once remembered as having failed to be read back from the spool (likewise). */
const SPOOL_FAULTS = 10_000;
/** Verdicts at once remembered for want of their marker in the store (likewise). */
const UNRECORDED = 10_000;

/**
 * The verdict on a sequence ended here whose marker the store did not take: its fragments, given
 * back to the broker to be dead-lettered whole, meet it here instead of the marker.
 */
interface UnrecordedVerdict {
  readonly outcome: 'completed' | 'failed' | 'rejected';
  /** The dead-letter reason (none for `completed`: its late fragments are acked). */
  readonly reason?: string;
  readonly until: number;
  /** The marker's write being tried again, for the fragments that meet the verdict meanwhile. */
  retry?: Promise<boolean>;
}

/**
 * Message Sequence's broker-held reassembly (`buffer: 'broker'`). Each fragment's message stays
 * unsettled in the broker while its sequence is incomplete: its body is checked (CRC-32, headers),
 * written to a spool file of this process and hashed as fragments arrive in order. Once the
 * sequence is complete and its SHA-256 verified, the handler reads it from the spool; then every
 * fragment is acked (or, if it failed, dead-lettered with the reason) at once. Only the completion
 * marker goes to the sequence store, so late duplicates are still recognised.
 *
 * Every fragment of a sequence must reach this consumer: the channel is partitioned by sequence
 * id and each partition has one active consumer (see `Transport.partitioned`). A consumer that
 * crashes leaves its fragments unsettled; the broker hands the partition to another instance,
 * which gets them again and completes the sequence.
 *
 * What it cannot hold goes through the store-buffered path ({@link AggregatorService}) instead:
 * a sequence declaring more fragments than the partition's window, one that would pass the spool's
 * byte budget or meets a full disk, and, when a partition's window fills up before any of its
 * sequences completes, the youngest of them. So do claim-checked fragments (with the rest of
 * their sequence), and sequences the store already holds fragments of (after such a fallback on
 * another instance).
 */
@Injectable()
export class BrokerHeldReassembler implements OnModuleDestroy {
  private readonly logger = new Logger('BrokerHeldReassembler');
  private readonly held = new Map<string, HeldSequence>();
  /** Sequences being looked up in the store, so that their concurrent fragments wait for one answer. */
  private readonly opening = new Map<string, Promise<HeldSequence | Route | Disposition>>();
  private readonly routes = new Map<string, Route>();
  /** Times each sequence could not be read back from the spool (see `spoolFault`). */
  private readonly spoolFaults = new Map<string, number>();
  /** Verdicts whose marker the store did not take (see `end`). */
  private readonly unrecorded = new Map<string, UnrecordedVerdict>();
  /** Fragments held per partition (`channel` and index). */
  private readonly load = new Map<string, number>();
  /** Held sequences per `abandoned` signal of the deliveries they hold (one listener each). */
  private readonly watched = new WeakMap<AbortSignal, Set<HeldSequence>>();
  private readonly spool: Spool;
  private readonly checks: FragmentChecks;
  private readonly lifecycle: SequenceLifecycle;
  private readonly traces: SequenceTracing;
  private closed = false;

  constructor(
    @Inject(BOUNDED_SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly metrics: SequenceMetrics,
    private readonly aggregator: AggregatorService,
    events: SequenceEvents,
    private readonly host: ConsumerHost,
  ) {
    this.lifecycle = new SequenceLifecycle(events);
    this.checks = new FragmentChecks(metrics, this.lifecycle, this.logger);
    this.traces = new SequenceTracing(options.tracing);
    // Encrypted when the store encrypts: the bodies wait in the spool instead of the store.
    this.spool = new Spool(options.sequence.spool.dir, options.sequence.spool.maxBytes, {
      encrypt: store.encrypts === true,
      sharedRoot: options.sequence.spool.dir === DEFAULT_SPOOL_DIR,
    });
  }

  /** Bytes spooled by this process now. */
  get spooledBytes(): number {
    return this.spool.bytes;
  }

  /**
   * Takes one fragment from a partition of the consumer's channel. The returned promise settles
   * when the fragment's fate is known: at once for a refused fragment or a duplicate, else once
   * its sequence was handled (or failed, expired, or went through the store).
   */
  async receive(message: InboundMessage, consumer: SequenceConsumer): Promise<Disposition> {
    let held: Promise<Disposition> | undefined;
    const now = await this.traces.receive(message, consumer.channel, async () => {
      const taken = await this.take(message, consumer).catch((error: unknown) => {
        this.logger.error(
          `${consumer.channel}: unexpected error taking a fragment; requeued: ${errorMessage(error)}`,
        );
        return this.requeue('unexpected error');
      });
      if ('held' in taken) {
        held = taken.held;
        return ACK; // the receive span ends here; the message stays held
      }
      return taken;
    });
    return held ?? now;
  }

  /**
   * At shutdown: hands every held fragment of sequences not being delivered back to the broker
   * (another instance completes them), so that the drain waits only for handlers running.
   */
  release(): void {
    for (const sequence of [...this.held.values()]) {
      if (sequence.phase !== 'holding') continue;
      void this.finishWith(sequence, { action: 'requeue', reason: 'shutting down' });
    }
  }

  async onModuleDestroy(): Promise<void> {
    this.closed = true;
    this.release();
    await this.spool.close().catch(() => undefined);
  }

  private async take(
    message: InboundMessage,
    consumer: SequenceConsumer,
  ): Promise<Disposition | { held: Promise<Disposition> }> {
    const { channel, options } = consumer;
    if (this.closed) return { action: 'requeue', reason: 'shutting down' };
    const body: unknown = message.body;
    const headers: Readonly<Record<string, unknown>> = message.headers ?? {};
    // Claim-checked fragments, and bodies that are not even bytes: the store path knows them.
    const marking = claimCheckMarking(headers);
    if (Buffer.isBuffer(body) && marking.via === 'ticket') {
      return this.ticketed(message, headers, consumer);
    }
    if (!Buffer.isBuffer(body) || marking.via !== 'inline') {
      return this.aggregator.receive(message, consumer);
    }
    const fragment = this.checks.check(channel, body, headers, options);
    if (isRefusal(fragment)) return fragment;
    const key = sequenceKey(channel, fragment.sequenceId);
    // Its sequence ended here without a marker: it meets the verdict, as it would the marker's.
    const unrecorded = this.unrecordedVerdict(key);
    if (unrecorded) return this.meet(unrecorded, key, fragment, consumer);
    // It can never fit in the window: the store path from its first fragment on. A streamed
    // sequence tells its size with its last fragment: what is held of it here goes there too,
    // else the sequence would be split between the spool and the store, and neither complete.
    if (fragment.size !== undefined && fragment.size > options.window) {
      const held = this.held.get(key) ?? (await this.opening.get(key));
      if (held instanceof HeldSequence && held.phase !== 'done') {
        // A size the fragments held here contradict (theirs fits the window): this fragment
        // alone is refused, as it would be in the window; the sequence stays held.
        const facts = { ...fragment, bodyBytes: body.length };
        const admission = admitFragment(held.state, facts, options);
        if (admission.kind === 'contradiction') {
          return this.checks.reject(
            channel,
            admission.code,
            `sequence ${fragment.sequenceId} fragment ${fragment.position}: ${admission.detail}`,
            fragment,
          );
        }
        void this.spill(held, consumer);
      }
      return this.toStore(key, message, consumer);
    }
    // Its subscription lost it already: the broker delivers it again, here or elsewhere.
    if (message.abandoned?.aborted) return this.requeue(NOT_HELD_HERE);
    const target = await this.sequenceOf(key, fragment, consumer);
    if (!(target instanceof HeldSequence)) {
      return 'to' in target ? this.aggregator.receive(message, consumer, target.startedAt) : target;
    }
    if (this.closed) return { action: 'requeue', reason: 'shutting down' };
    return this.hold(target, fragment, body, message, consumer);
  }

  /**
   * A claim-checked fragment goes through the store path, and so does the rest of its sequence: a
   * producer that claim-checked only some fragments of a sequence would otherwise have it split
   * between the spool and the store, and neither would ever complete. What is held of it here
   * moves to the store, and its later fragments follow. One being handled here meanwhile has this
   * fragment come back later, to meet its verdict.
   */
  private async ticketed(
    message: InboundMessage,
    headers: Readonly<Record<string, unknown>>,
    consumer: SequenceConsumer,
  ): Promise<Disposition> {
    let fragment: FragmentHeaders;
    try {
      fragment = parseFragmentHeaders(headers);
    } catch {
      return this.aggregator.receive(message, consumer); // it refuses the headers with the reason
    }
    const { sequenceId } = fragment;
    const key = sequenceKey(consumer.channel, sequenceId);
    // Its sequence ended here without a marker: the store would take it for a new one.
    const unrecorded = this.unrecordedVerdict(key);
    if (unrecorded) return this.meet(unrecorded, key, fragment, consumer);
    // At once: its inline fragments delivered right behind it must not open it here meanwhile.
    this.routeToStore(key, consumer);
    const opening = this.opening.get(key);
    const held = this.held.get(key) ?? (opening && (await opening));
    if (held instanceof HeldSequence && held.phase === 'delivering' && !held.spilling) {
      return this.requeue(`sequence ${sequenceId} is being settled`);
    }
    if (held instanceof HeldSequence && held.phase === 'holding') {
      this.logger.warn(
        `${consumer.channel}: sequence ${sequenceId} has claim-checked fragments; what is held ` +
          `of it goes through the ${this.store.name} store`,
      );
      void this.spill(held, consumer);
    }
    return this.toStore(key, message, consumer);
  }

  /** The held sequence of `fragment`, or where else it goes. */
  private async sequenceOf(
    key: string,
    fragment: FragmentHeaders,
    consumer: SequenceConsumer,
  ): Promise<HeldSequence | Route | Disposition> {
    const held = this.held.get(key);
    if (held && held.phase !== 'done') return held;
    const route = this.routes.get(key);
    if (route && route.until > Date.now()) return route;
    let opening = this.opening.get(key);
    if (!opening) {
      opening = this.open(key, fragment, consumer).finally(() => this.opening.delete(key));
      this.opening.set(key, opening);
    }
    return opening;
  }

  /** Asks the store about a sequence this consumer does not hold: new, finished, or buffered there. */
  private async open(
    key: string,
    fragment: FragmentHeaders,
    consumer: SequenceConsumer,
  ): Promise<HeldSequence | Route | Disposition> {
    const ref: SequenceRef = { scope: consumer.channel, sequenceId: fragment.sequenceId };
    let state: 'unknown' | 'open' | 'finished';
    try {
      state = (await this.store.status!(ref, Date.now())).state;
    } catch (error) {
      this.logger.warn(
        `${this.store.name} store could not tell the status of sequence ${ref.sequenceId} on ` +
          `${ref.scope}; requeued: ${errorMessage(error)}`,
      );
      return this.requeue('store unavailable');
    }
    // Finished (the store path answers late duplicates as it always does), or buffered there.
    if (state !== 'unknown') return this.routeToStore(key, consumer);
    const partition = partitionIndex(fragment.sequenceId, consumer.options.partitions);
    try {
      if (this.closed) return { action: 'requeue', reason: 'shutting down' };
      const file = await this.spool.create();
      if (this.closed) {
        void this.removeQuietly(file);
        return { action: 'requeue', reason: 'shutting down' };
      }
      const sequence = new HeldSequence(
        consumer.channel,
        fragment.sequenceId,
        partition,
        file,
        Date.now(),
      );
      this.held.set(key, sequence);
      return sequence;
    } catch (error) {
      this.logger.warn(
        `${consumer.channel}: could not open a spool file for sequence ${ref.sequenceId}; it ` +
          `goes through the ${this.store.name} store: ${errorMessage(error)}`,
      );
      return this.routeToStore(key, consumer);
    }
  }

  /**
   * Takes `fragment` into its held sequence: `{ held }`, settled with the sequence, once taken;
   * else its disposition (refused, or requeued), which the receive span records.
   */
  private hold(
    sequence: HeldSequence,
    fragment: FragmentHeaders,
    body: Buffer,
    message: InboundMessage,
    consumer: SequenceConsumer,
  ): Disposition | Promise<Disposition> | { held: Promise<Disposition> } {
    const { channel, options } = consumer;
    // Its subscription lost it while the sequence was being opened: nothing may stay open for a
    // sequence this consumer holds nothing of (a later delivery would start it afresh here).
    if (message.abandoned?.aborted) {
      const requeue = () => this.requeue(NOT_HELD_HERE);
      return sequence.fragments.size === 0 && sequence.phase === 'holding'
        ? this.dropEmpty(sequence, requeue)
        : requeue();
    }
    const facts = { ...fragment, bodyBytes: body.length };
    const admission = admitFragment(sequence.state, facts, options);
    // Being delivered, spilled, ended or released meanwhile: only a duplicate of a fragment still
    // held by a sequence being handled may take its place; anything else comes back later and
    // meets the sequence's verdict. Not while it moves to the store: it settles the fragments it
    // took, one by one, as the store takes them, and would leave the newer delivery unsettled.
    const superseding =
      admission.kind === 'duplicate' &&
      sequence.fragments.has(fragment.position) &&
      !sequence.spilling;
    if (sequence.phase !== 'holding' && !(sequence.phase === 'delivering' && superseding)) {
      return this.requeue(`sequence ${fragment.sequenceId} is being settled`);
    }
    if (admission.kind === 'contradiction') {
      // A first fragment refused: nothing is held, nothing to keep open.
      const reject = () =>
        this.checks.reject(
          channel,
          admission.code,
          `sequence ${fragment.sequenceId} fragment ${fragment.position}: ${admission.detail}`,
          fragment,
        );
      return sequence.fragments.size === 0 ? this.dropEmpty(sequence, reject) : reject();
    }
    let settle!: (disposition: Disposition) => void;
    const settled = new Promise<Disposition>((resolve) => (settle = resolve));
    if (admission.kind === 'duplicate' && superseding) {
      // The broker delivered it again: after a lost channel the earlier delivery is gone, so the
      // newest is the one to keep; the earlier one is acked (a no-op when it is gone).
      const earlier = sequence.fragments.get(fragment.position)!;
      // The spool has these bytes already (the same CRC-32) once the earlier write went through.
      const released = earlier.released && message.releaseBody !== undefined;
      if (released) message.releaseBody();
      sequence.fragments.set(fragment.position, {
        ...earlier,
        headers: message.headers,
        redelivered: message.redelivered,
        settle,
        abandoned: message.abandoned,
        released,
        releaseBody: releaserOf(message),
        // Until the earlier write is known to have gone through, this delivery's body stands in.
        body: earlier.body && body,
      });
      this.watch(sequence, message.abandoned);
      earlier.settle(ACK);
      this.metrics.duplicateFragment(channel);
      this.lifecycle.fragmentDuplicate(channel, fragment);
      return { held: settled };
    }
    if (admission.kind === 'limit') {
      const detail = `sequence ${fragment.sequenceId}: ${admission.detail}`;
      if (sequence.fragments.size === 0) {
        // A first fragment over the limits is refused alone, as the store refuses it: no
        // verdict is recorded, so a corrected resend under the same id is taken.
        return this.dropEmpty(sequence, () =>
          this.checks.reject(channel, admission.code, detail, fragment),
        );
      }
      settle({ action: 'dead-letter', reason: deathReason(admission.code, detail) });
      void this.end(sequence, consumer, 'rejected', admission.code, detail);
      return { held: settled };
    }
    if (!this.spool.reserve(body.length)) {
      this.logger.warn(
        `${channel}: the spool is full (sequence.spool.maxBytes ${this.options.sequence.spool.maxBytes}); ` +
          `sequence ${fragment.sequenceId} goes through the ${this.store.name} store`,
      );
      void this.spill(sequence, consumer);
      return this.toStore(keyOf(sequence), message, consumer);
    }
    if (!sequence.started) {
      sequence.started = true;
      this.metrics.sequenceStarted(channel);
      this.lifecycle.started(channel, fragment);
    }
    sequence.describe(fragment);
    recordFragment(sequence.state, facts, Date.now());
    const { offset, length, written } = sequence.spool(fragment.position, body);
    const held: HeldFragment = {
      offset,
      length,
      position: fragment.position,
      crc32: fragment.crc32,
      headers: message.headers,
      redelivered: message.redelivered,
      settle,
      abandoned: message.abandoned,
      released: false,
      releaseBody: releaserOf(message),
      body,
    };
    sequence.fragments.set(fragment.position, held);
    this.watch(sequence, message.abandoned);
    void written.then((ok) => {
      // The delivery holding these bytes now: this one, or a duplicate that took its place while
      // they were being written (it has the same place in the file, and its body stands in).
      const holder = sequence.fragments.get(fragment.position);
      if (holder === undefined || holder.offset !== offset) return;
      if (!ok) {
        // The disk refused it (full, or failing): waiting for the sequence to complete would keep
        // every later body in memory. The store takes it now, as when the spool is over its size.
        if (sequence.phase === 'holding') {
          this.logger.warn(
            `${channel}: could not spool fragment ${fragment.position} of sequence ` +
              `${fragment.sequenceId}; it goes through the ${this.store.name} store`,
          );
          void this.spill(sequence, consumer);
        }
        return;
      }
      holder.body = undefined;
      // Spooled: the transport need not hold the body any more (the broker holds the message).
      if (holder.releaseBody && !holder.released) {
        holder.releaseBody();
        holder.released = true;
      }
    });
    this.lifecycle.fragmentAccepted(channel, fragment, body.length);
    const load = this.addLoad(sequence, 1);
    this.scheduleExpiry(sequence, consumer);
    if (sequence.complete) {
      void this.deliver(sequence, consumer, message);
    } else if (load >= options.window) {
      this.relieve(sequence, consumer);
    }
    return { held: settled };
  }

  /**
   * A partition's window is full and none of its sequences is complete: the youngest goes
   * through the store, which frees its part of the window. A complete one being delivered frees
   * its part when it settles: nothing moves meanwhile.
   */
  private relieve(cause: HeldSequence, consumer: SequenceConsumer): void {
    let youngest: HeldSequence | undefined;
    for (const sequence of this.held.values()) {
      if (sequence.channel !== cause.channel || sequence.partition !== cause.partition) continue;
      if (sequence.phase === 'delivering') return;
      if (sequence.phase !== 'holding') continue;
      if (!youngest || sequence.state.firstFragmentAt >= youngest.state.firstFragmentAt) {
        youngest = sequence;
      }
    }
    if (!youngest) return;
    this.logger.warn(
      `${cause.channel}: partition ${cause.partition} holds ${consumer.options.window} fragments ` +
        `(its window) with no sequence complete; sequence ${youngest.sequenceId} goes through ` +
        `the ${this.store.name} store`,
    );
    void this.spill(youngest, consumer);
  }

  /**
   * Hands a held sequence to the store path: each held fragment, read back from the spool, is
   * taken as if just delivered, and settled as the store path says. Its later fragments go there
   * too.
   */
  private async spill(sequence: HeldSequence, consumer: SequenceConsumer): Promise<void> {
    if (sequence.phase !== 'holding') return;
    sequence.phase = 'delivering';
    sequence.spilling = true;
    clearTimeout(sequence.timer);
    const key = keyOf(sequence);
    // The store counts its deadline (and age) from its first fragment here, not from the move.
    const { startedAt } = this.routeToStore(key, consumer, sequence.state.firstFragmentAt);
    this.forget(sequence);
    // Out of the window at once: what it frees while it moves must not spill others.
    this.addLoad(sequence, -sequence.fragments.size);
    await sequence.written().catch(() => undefined);
    const fragments = [...sequence.fragments.values()].sort((a, b) => a.position - b.position);
    // The last fragment is settled once the spool file is gone, as finishWith settles: when the
    // broker holds none of the sequence unsettled, this process holds nothing of it either.
    let settleLast = () => {};
    for (const [index, fragment] of fragments.entries()) {
      let disposition: Disposition;
      try {
        const body = fragment.body ?? (await readAll(sequence, fragment));
        disposition = await this.aggregator.receive(
          { channel: consumer.channel, body, headers: fragment.headers, redelivered: true },
          consumer,
          startedAt,
        );
        // The transport forwards what it no longer holds with the body read back here.
        if (fragment.released && disposition.action !== 'ack')
          disposition = { ...disposition, body };
      } catch (error) {
        this.logger.warn(
          `${consumer.channel}: could not read fragment ${fragment.position} of sequence ` +
            `${sequence.sequenceId} back from the spool; requeued: ${errorMessage(error)}`,
        );
        disposition = this.requeue('spool unreadable');
      }
      if (index < fragments.length - 1) fragment.settle(disposition);
      else settleLast = () => fragment.settle(disposition);
    }
    sequence.fragments.clear();
    sequence.phase = 'done';
    await this.discard(sequence);
    settleLast();
  }

  private async deliver(
    sequence: HeldSequence,
    consumer: SequenceConsumer,
    completedBy: InboundMessage,
  ): Promise<void> {
    if (sequence.phase !== 'holding') return;
    sequence.phase = 'delivering';
    clearTimeout(sequence.timer);
    const { channel } = consumer;
    const complete = sequence.toComplete();
    try {
      await sequence.written();
    } catch (error) {
      this.logger.warn(
        `${channel}: could not spool sequence ${sequence.sequenceId} (${errorMessage(error)}); ` +
          `it goes through the ${this.store.name} store`,
      );
      sequence.phase = 'holding';
      return this.spill(sequence, consumer);
    }
    // The partition may have moved while this consumer held the sequence, and the instance it
    // moved to completed it: a handler run here now would be a second one, after the marker.
    // Through the store, the fragments get the stored verdict, as late duplicates do.
    if (await this.finishedInStore(sequence)) {
      sequence.phase = 'holding';
      return this.spill(sequence, consumer);
    }
    await this.traces.process(channel, complete, completedBy, async () => {
      const declared = { sha256: complete.sha256, bytes: complete.declaredBytes };
      let digest: PayloadDigest;
      try {
        digest = sequence.inOrderDigest() ?? (await this.digest(sequence));
      } catch (error) {
        // A body whose CRC-32 differs was changed on disk; a SHA-256 mismatch below is the producer's.
        const code =
          error instanceof StoredFragmentIntegrityError ? 'integrity-mismatch' : undefined;
        return this.spoolFault(sequence, consumer, errorMessage(error), code);
      }
      if (!matches(digest, declared)) {
        const error = new SequenceIntegrityError(sequence.sequenceId, declared, digest);
        return this.end(sequence, consumer, 'failed', 'integrity-mismatch', error.message);
      }
      // Each body is checked against its CRC-32 as the spool reads it (as the store path does with
      // a store that `verifiesReads`), which spares a second SHA-256 pass; the count is checked.
      const payload = new ReassembledPayload(
        { ...complete, sha256: digest.sha256 },
        () => sequence.read(),
        { digest, hash: false },
      );
      // A spool fault gives the fragments back, but for the last try (see spoolFault): a
      // request's reply then waits for the delivery that settles it.
      const handsBack = () =>
        !!(payload.integrityFailure || payload.readFailure) &&
        this.givesBackAt(this.spoolTry(sequence), consumer);
      const outcome = await runSequenceHandler(payload, consumer, this.metrics, this.logger, {
        handsBack,
        stop: this.host.stopping,
      });
      payload.close();
      if (payload.integrityFailure) {
        const { message } = payload.integrityFailure;
        return this.spoolFault(sequence, consumer, message, 'integrity-mismatch');
      }
      if (payload.readFailure) {
        return this.spoolFault(sequence, consumer, payload.readFailure.message);
      }
      // Shutting down between two attempts: the fragments go back, for another instance.
      if (!outcome.ok && outcome.stopped) {
        return this.giveBack(sequence, 'shutting down', consumer);
      }
      if (!outcome.ok) {
        const { code, detail } = handlerRejection(`sequence ${sequence.sequenceId}`, outcome);
        return this.end(sequence, consumer, 'failed', code, detail, outcome.attempts);
      }
      this.spoolFaults.delete(keyOf(sequence));
      if (!(await this.record(refOf(sequence), 'completed'))) {
        // Without a marker a late duplicate would start the sequence afresh here: spooled, then
        // expired and dead-lettered, or handled again if the whole sequence came again.
        this.remember(keyOf(sequence), { outcome: 'completed' });
      }
      this.metrics.sequenceCompleted(channel, complete.firstFragmentAt);
      this.lifecycle.completed(channel, complete, outcome.attempts);
      await this.finishWith(sequence, ACK, consumer);
      return ACK;
    });
  }

  /** Whether the store holds a verdict for the sequence; a store that cannot tell is no. */
  private async finishedInStore(sequence: HeldSequence): Promise<boolean> {
    const ref = refOf(sequence);
    try {
      return (await this.store.status!(ref, Date.now())).state === 'finished';
    } catch (error) {
      this.logger.warn(
        `${this.store.name} store could not tell whether sequence ${ref.sequenceId} on ` +
          `${ref.scope} was finished elsewhere; handling it: ${errorMessage(error)}`,
      );
      return false;
    }
  }

  /**
   * Ends a sequence that will not be handled: its fragments are dead-lettered with the reason,
   * and its marker recorded so that late duplicates get the same verdict. `detail` names the
   * sequence (`sequence <id>: …`), as the store path's reasons do.
   */
  private async end(
    sequence: HeldSequence,
    consumer: SequenceConsumer,
    outcome: 'failed' | 'rejected' | 'expired',
    code: RejectionCode,
    detail: string,
    handlerAttempts?: number,
  ): Promise<Disposition> {
    const { channel } = consumer;
    sequence.phase = 'delivering';
    clearTimeout(sequence.timer);
    this.spoolFaults.delete(keyOf(sequence));
    const reason = deathReason(code, detail);
    const marker = outcome === 'rejected' ? 'rejected' : 'failed';
    if (!(await this.record(refOf(sequence), marker, reason))) {
      // Without a marker, its fragments given back to be dead-lettered whole (their bodies
      // released) would be taken for a new sequence: spooled, and expired or handled, again.
      this.remember(keyOf(sequence), { outcome: marker, reason });
    }
    let expired: ExpiredSequence | undefined;
    if (outcome === 'expired') {
      expired = sequence.toExpired(Date.now());
      this.metrics.sequenceExpired(channel);
      this.lifecycle.expired(channel, expired);
    } else {
      this.metrics.sequenceRejected(channel, code);
      if (handlerAttempts !== undefined) {
        this.lifecycle.failed(channel, sequence.sequenceId, code, detail, handlerAttempts);
      } else {
        this.lifecycle.rejected(channel, sequence.sequenceId, code, detail);
      }
    }
    this.logger.error(`${channel}: dead-lettering the fragments of ${reason}`);
    const disposition: Disposition = { action: 'dead-letter', reason };
    await this.finishWith(sequence, disposition, consumer);
    if (expired) this.callOnExpired(expired);
    return disposition;
  }

  /** Which read of `sequence` back from the spool a fault now is, earlier faults counted. */
  private spoolTry(sequence: HeldSequence): number {
    return (this.spoolFaults.get(keyOf(sequence)) ?? 0) + 1;
  }

  /** Whether a spool fault at read `tries` gives the fragments back rather than ending it. */
  private givesBackAt(tries: number, consumer: SequenceConsumer): boolean {
    return tries < consumer.options.handlerRetry.attempts;
  }

  /**
   * The spool could not give a complete sequence back to be verified or handled: a read failed,
   * or (`integrity-mismatch`) a body read back differs from the one spooled (its CRC-32), the
   * handler's stream failing with it. Its fragments are still in the broker: they are given back,
   * and spooled afresh when they come again, until the sequence has been read back
   * `handlerRetry.attempts` times; then it is dead-lettered whole, `store-unavailable` or
   * `integrity-mismatch`, with the spool's error (a failing disk would otherwise have the
   * sequence spooled again for ever, on a queue without a delivery limit).
   */
  private async spoolFault(
    sequence: HeldSequence,
    consumer: SequenceConsumer,
    problem: string,
    code: 'store-unavailable' | 'integrity-mismatch' = 'store-unavailable',
  ): Promise<Disposition> {
    const key = keyOf(sequence);
    const tries = this.spoolTry(sequence);
    const { attempts } = consumer.options.handlerRetry;
    this.spoolFaults.delete(key);
    if (!this.givesBackAt(tries, consumer)) {
      const detail =
        `sequence ${sequence.sequenceId}: failed ${tries} reads back from the spool ` +
        `(handlerRetry.attempts ${attempts}): ${problem}`;
      return this.end(sequence, consumer, 'failed', code, detail);
    }
    this.spoolFaults.set(key, tries);
    if (this.spoolFaults.size > SPOOL_FAULTS) {
      this.spoolFaults.delete(this.spoolFaults.keys().next().value as string);
    }
    this.logger.warn(
      `${consumer.channel}: could not read sequence ${sequence.sequenceId} back from the spool ` +
        `(try ${tries} of ${attempts}); its fragments are given back to be spooled again: ${problem}`,
    );
    return this.giveBack(
      sequence,
      code === 'integrity-mismatch' ? 'spool bytes changed' : 'spool unreadable',
      consumer,
    );
  }

  /** Gives every fragment back to the broker, behind what is queued, for another try. */
  private async giveBack(
    sequence: HeldSequence,
    reason: string,
    consumer: SequenceConsumer,
  ): Promise<Disposition> {
    const disposition = this.requeue(reason);
    await this.finishWith(sequence, disposition, consumer);
    return disposition;
  }

  /**
   * Settles every held fragment of the sequence alike, once its spool file is gone. Its part of
   * the window freed, a partition still full is relieved: a full partition waits for a sequence
   * being settled rather than spill another (see relieve), and no new fragment comes to ask.
   */
  private async finishWith(
    sequence: HeldSequence,
    disposition: Disposition,
    consumer?: SequenceConsumer,
  ): Promise<void> {
    this.forget(sequence);
    sequence.phase = 'done';
    await this.discard(sequence);
    const load = this.addLoad(sequence, -sequence.settleAll(disposition));
    if (consumer && !this.closed && load >= consumer.options.window) {
      this.relieve(sequence, consumer);
    }
  }

  /**
   * Writes the completion marker; a store that cannot is logged, the verdict stands. False when
   * the store failed (not when it holds another outcome already: that one stands).
   */
  private async record(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    reason?: string,
  ): Promise<boolean> {
    try {
      const recorded = await this.store.finish(ref, outcome, {
        now: Date.now(),
        retentionMs: this.options.sequence.retentionMs,
        consumerId: this.options.consumerId,
        reason,
      });
      if (!recorded) {
        this.logger.warn(
          `sequence ${ref.sequenceId} on ${ref.scope} was ${outcome} here, but the ` +
            `${this.store.name} store already holds another outcome for it (another instance ` +
            'took the partition over meanwhile); the stored outcome stands',
        );
      }
      return true;
    } catch (error) {
      this.logger.error(
        `sequence ${ref.sequenceId} on ${ref.scope} was ${outcome} but its marker could not be ` +
          `written to the ${this.store.name} store (a late duplicate would start it again): ` +
          errorMessage(error),
      );
      return false;
    }
  }

  /** Remembers a verdict the store did not take, for `retentionMs` and for so many sequences. */
  private remember(key: string, verdict: Pick<UnrecordedVerdict, 'outcome' | 'reason'>): void {
    this.unrecorded.delete(key);
    this.unrecorded.set(key, {
      ...verdict,
      until: Date.now() + this.options.sequence.retentionMs,
    });
    if (this.unrecorded.size > UNRECORDED) {
      this.unrecorded.delete(this.unrecorded.keys().next().value as string);
    }
  }

  /** The live verdict on `key` that the store did not take, if any. */
  private unrecordedVerdict(key: string): UnrecordedVerdict | undefined {
    const verdict = this.unrecorded.get(key);
    if (!verdict || verdict.until > Date.now()) return verdict;
    this.unrecorded.delete(key);
    return undefined;
  }

  /**
   * A fragment of a sequence ended here whose marker the store did not take: given back for its
   * dead letter, or late. The marker is written again (once at a time); the fragment is
   * dead-lettered with the verdict's reason whether it then lands or not, as it would be by the
   * store path on meeting the marker, or, of a completed sequence, acked as a duplicate.
   */
  private async meet(
    verdict: UnrecordedVerdict,
    key: string,
    fragment: FragmentHeaders,
    consumer: SequenceConsumer,
  ): Promise<Disposition> {
    const { channel } = consumer;
    verdict.retry ??= this.record(
      { scope: channel, sequenceId: fragment.sequenceId },
      verdict.outcome,
      verdict.reason,
    ).finally(() => (verdict.retry = undefined));
    if (await verdict.retry) {
      if (this.unrecorded.get(key) === verdict) this.unrecorded.delete(key);
    }
    if (verdict.reason === undefined) {
      this.metrics.duplicateFragment(channel);
      this.lifecycle.fragmentDuplicate(channel, fragment);
      return ACK;
    }
    const { code, detail } = splitDeathReason(verdict.reason);
    this.metrics.fragmentRejected(channel, deadLetterReasonLabel(verdict.reason));
    this.lifecycle.fragmentRejected(channel, code, detail, fragment);
    return { action: 'dead-letter', reason: verdict.reason };
  }

  private scheduleExpiry(sequence: HeldSequence, consumer: SequenceConsumer): void {
    const { ms, strategy } = consumer.options.timeout;
    if (sequence.timer && strategy === 'fixed') return;
    const from = strategy === 'fixed' ? sequence.state.firstFragmentAt : Date.now();
    this.expireAt(sequence, consumer, from + ms);
  }

  /** Expires `sequence` at `deadline` (`timeoutMs` after its start), unless it settles first. */
  private expireAt(sequence: HeldSequence, consumer: SequenceConsumer, deadline: number): void {
    const { ms } = consumer.options.timeout;
    clearTimeout(sequence.timer);
    const wait = Math.max(0, deadline - Date.now());
    sequence.timer = setTimeout(
      () => {
        if (sequence.phase !== 'holding') return;
        // A timer waits MAX_TIMER_MS at most (about 24.8 days; a longer one fires after 1 ms).
        if (wait > MAX_TIMER_MS) return this.expireAt(sequence, consumer, deadline);
        const missing = sequence.toExpired(Date.now()).missingPositions;
        const detail =
          `sequence ${sequence.sequenceId}: expired after ${ms} ms with ${sequence.fragments.size} fragment(s) received` +
          (missing.length > 0 ? `, ${missing.length} known to be missing` : ', the last not yet');
        void this.end(sequence, consumer, 'expired', 'sequence-expired', detail);
      },
      Math.min(wait, MAX_TIMER_MS),
    );
    sequence.timer.unref();
  }

  /**
   * Calls `onExpired` once the sequence's fragments are settled, without awaiting it: a hook that
   * is slow, or never settles, holds no fragment, spool file or room in the window.
   */
  private callOnExpired(expired: ExpiredSequence): void {
    const hook = this.options.sequence.onExpired;
    if (!hook) return;
    void Promise.resolve()
      .then(() => hook(expired))
      .catch((error: unknown) =>
        this.logger.warn(
          `onExpired hook failed for sequence ${expired.sequenceId}: ${errorMessage(error)}`,
        ),
      );
  }

  private async digest(sequence: HeldSequence): Promise<PayloadDigest> {
    const hash = sha256Hasher();
    let bytes = 0;
    for await (const chunk of sequence.read()) {
      hash.update(chunk as Buffer);
      bytes += (chunk as Buffer).length;
    }
    return { sha256: hash.digest('hex'), bytes };
  }

  private routeToStore(key: string, consumer: SequenceConsumer, startedAt?: number): Route {
    const route: Route = {
      to: 'store',
      until: Date.now() + consumer.options.timeout.ms,
      startedAt,
    };
    this.routes.delete(key);
    this.routes.set(key, route);
    if (this.routes.size > STORE_ROUTES) {
      this.routes.delete(this.routes.keys().next().value as string);
    }
    return route;
  }

  /** Hands `message` to the store path, with when its sequence began here if it moved from here. */
  private toStore(
    key: string,
    message: InboundMessage,
    consumer: SequenceConsumer,
  ): Promise<Disposition> {
    return this.aggregator.receive(message, consumer, this.routes.get(key)?.startedAt);
  }

  private addLoad(sequence: HeldSequence, change: number): number {
    const key = `${sequence.channel}\u0000${sequence.partition}`;
    const load = Math.max(0, (this.load.get(key) ?? 0) + change);
    if (load === 0) this.load.delete(key);
    else this.load.set(key, load);
    return load;
  }

  private forget(sequence: HeldSequence): void {
    const key = keyOf(sequence);
    if (this.held.get(key) === sequence) this.held.delete(key);
    for (const signal of sequence.watchedSignals) this.watched.get(signal)?.delete(sequence);
    sequence.watchedSignals.clear();
  }

  /**
   * Watches the signal that tells when a fragment's delivery can no longer be settled here: one
   * listener per signal (a subscription's channel), whatever number of sequences it serves.
   */
  private watch(sequence: HeldSequence, signal: AbortSignal | undefined): void {
    if (!signal || sequence.watchedSignals.has(signal)) return;
    let sequences = this.watched.get(signal);
    if (!sequences) {
      const watching = new Set<HeldSequence>();
      sequences = watching;
      this.watched.set(signal, watching);
      signal.addEventListener(
        'abort',
        () => {
          for (const lost of [...watching]) this.abandon(lost, signal);
        },
        { once: true },
      );
    }
    sequences.add(sequence);
    sequence.watchedSignals.add(signal);
  }

  /**
   * The broker took back the deliveries `signal` stood for (the partition went to another
   * consumer, or its channel was lost): a sequence still holding one of them is dropped here
   * with a warning (no marker, no expiry, no dead letter), and left to whichever consumer gets
   * its fragments again. One already complete goes on: its handler is running.
   */
  private abandon(sequence: HeldSequence, signal: AbortSignal): void {
    if (sequence.phase !== 'holding') return;
    const fragments = [...sequence.fragments.values()];
    if (!fragments.some((fragment) => fragment.abandoned === signal)) return;
    if (!this.closed) {
      this.logger.warn(
        `${sequence.channel}: the broker took back the unsettled fragments of partition ` +
          `${sequence.partition}; sequence ${sequence.sequenceId} (${fragments.length} ` +
          'fragment(s) held) is dropped here and completes wherever they are delivered again',
      );
    }
    void this.finishWith(sequence, {
      action: 'requeue',
      reason: NOT_HELD_HERE,
    });
  }

  /**
   * Closes a sequence that holds no fragment (nothing stays open, nor is a verdict kept), then
   * settles the delivery that opened it once its spool file is gone.
   */
  private async dropEmpty(
    sequence: HeldSequence,
    settle: () => Disposition | Promise<Disposition>,
  ): Promise<Disposition> {
    this.forget(sequence);
    sequence.phase = 'done';
    await this.discard(sequence);
    return settle();
  }

  /**
   * Gives a sequence's spool room back and removes its file. Never rejects: a file system that
   * cannot unlink (read-only after disk errors, permissions) is logged, and the file left.
   */
  private async discard(sequence: HeldSequence): Promise<void> {
    this.spool.release(sequence.spooled);
    sequence.spooled = 0;
    await this.removeQuietly(sequence.file);
  }

  private async removeQuietly(file: SpoolFile): Promise<void> {
    await file
      .remove()
      .catch((error: unknown) =>
        this.logger.warn(`could not delete a spool file: ${errorMessage(error)}`),
      );
  }

  private requeue(reason: string): Disposition {
    return { action: 'requeue', delayMs: this.options.tuning.backpressureDelayMs, reason };
  }
}

/** The key of a channel's sequence in the reassembler's maps. */
function sequenceKey(channel: string, sequenceId: string): string {
  return `${channel}\u0000${sequenceId}`;
}

function keyOf(sequence: HeldSequence): string {
  return sequenceKey(sequence.channel, sequence.sequenceId);
}

/** The store's name for a held sequence (its completion marker's). */
function refOf(sequence: HeldSequence): SequenceRef {
  return { scope: sequence.channel, sequenceId: sequence.sequenceId };
}

/** What releases `message`'s body in its transport, where the transport offers that. */
function releaserOf(message: InboundMessage): (() => void) | undefined {
  return message.releaseBody && (() => message.releaseBody?.());
}

/** One held fragment's body, read back from the spool. */
async function readAll(sequence: HeldSequence, fragment: HeldFragment): Promise<Buffer> {
  const pieces: Buffer[] = [];
  for await (const piece of sequence.file.read([fragment], sequence.sequenceId)) {
    pieces.push(piece as Buffer);
  }
  return Buffer.concat(pieces);
}
