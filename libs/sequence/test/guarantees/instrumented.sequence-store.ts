import { Readable } from 'node:stream';
import type {
  AcceptContext,
  AcceptResult,
  FinishContext,
  FinishedOutcome,
  FragmentRecord,
  SequenceRef,
  SequenceStoreStats,
} from 'nest-sequence/ports';
import type { ExpiredSequence, SequenceStore } from 'nest-sequence';

/** One `accept` that reached the real store: when (the `now` it was given) and what it answered. */
export interface AcceptRecord {
  readonly sequenceId: string;
  readonly position: number;
  readonly now: number;
  readonly status: AcceptResult['status'];
  /** The store stored its body: `stored`, or a `complete` that says so (not a takeover). */
  readonly stored: boolean;
}

/**
 * Fault injection around a real {@link SequenceStore}: every call is delegated unchanged unless a
 * fault is switched on. Several instances may wrap one store, one per simulated consumer.
 *
 * - `unreachable`: `accept` throws (the store cannot be reached);
 * - `failRenewals`: `renewLease` throws, so a held completion lease lapses;
 * - `failNextReads`: that many `read` streams fail;
 * - `corruptNextReads`: that many `read` streams return the bytes with the first one flipped;
 * - `holdAccepts()`: `accept` waits before reaching the store, so fragments stay in the consumer's
 *   hands (unsettled), until `crash()`;
 * - `crash()`: from now on every call fails, as for a consumer process that died.
 */
export class InstrumentedStore implements SequenceStore {
  readonly name: string;
  /** Accepts that reached the real store, in order. */
  readonly accepts: AcceptRecord[] = [];
  /** Accepts refused because the store was `unreachable`. */
  refusedAccepts = 0;
  /** Names of the calls refused after `crash()`, in order. */
  readonly refusedAfterCrash: string[] = [];
  unreachable = false;
  /** `renewLease` throws (the store is unreachable for lease renewals only). */
  failRenewals = false;
  failNextReads = 0;
  corruptNextReads = 0;
  /** `read` calls, in order (each one is a pass over a sequence's bytes). */
  reads = 0;
  private gate?: Promise<void>;
  private rejectGate?: (error: Error) => void;
  private crashed = false;

  /** The inner store's, when it has them: read-only, never faulted. */
  readonly status?: SequenceStore['status'];
  readonly inspect?: SequenceStore['inspect'];

  constructor(readonly inner: SequenceStore) {
    this.name = inner.name;
    if (inner.status) this.status = (ref, now) => inner.status!(ref, now);
    if (inner.inspect) this.inspect = (ref, now) => inner.inspect!(ref, now);
  }

  holdAccepts(): void {
    this.gate = new Promise<void>((_resolve, reject) => (this.rejectGate = reject));
    // Marked handled: nobody may be waiting on the gate when it is rejected.
    this.gate.catch(() => undefined);
  }

  crash(): void {
    this.crashed = true;
    this.rejectGate?.(this.crashError());
  }

  /** Positions of `sequenceId` this wrapper stored (not refused, a duplicate or a takeover). */
  storedPositions(sequenceId: string): number[] {
    return this.accepts
      .filter((a) => a.sequenceId === sequenceId && a.stored)
      .map((a) => a.position);
  }

  async accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult> {
    this.checkAlive('accept');
    if (this.unreachable) {
      this.refusedAccepts++;
      throw new Error('injected fault: sequence store unreachable');
    }
    if (this.gate) await this.gate;
    this.checkAlive('accept');
    const result = await this.inner.accept(fragment, context);
    this.accepts.push({
      sequenceId: fragment.sequenceId,
      position: fragment.position,
      now: context.now,
      status: result.status,
      stored:
        result.status === 'stored' || (result.status === 'complete' && result.stored === true),
    });
    return result;
  }

  async renewLease(
    ref: SequenceRef,
    consumerId: string,
    leaseMs: number,
    now: number,
  ): Promise<boolean> {
    this.checkAlive('renewLease');
    if (this.failRenewals) throw new Error('injected fault: lease renewal failed');
    return this.inner.renewLease(ref, consumerId, leaseMs, now);
  }

  async releaseLease(ref: SequenceRef, consumerId: string, now: number): Promise<void> {
    this.checkAlive('releaseLease');
    return this.inner.releaseLease(ref, consumerId, now);
  }

  /**
   * The real store's, unless reads are being corrupted here, after its check: then the delivery
   * must verify what it reads itself.
   */
  get verifiesReads(): boolean {
    return this.inner.verifiesReads === true && this.corruptNextReads === 0;
  }

  read(ref: SequenceRef): Readable {
    this.reads++;
    if (this.corruptNextReads > 0 && !this.crashed) {
      this.corruptNextReads--;
      let first = true;
      return this.inner.read(ref).map((chunk: Buffer) => {
        if (!first || chunk.length === 0) return chunk;
        first = false;
        const changed = Buffer.from(chunk);
        changed[0] ^= 0xff;
        return changed;
      });
    }
    if (this.crashed || this.failNextReads > 0) {
      if (this.crashed) this.refusedAfterCrash.push('read');
      else this.failNextReads--;
      const error = this.crashed ? this.crashError() : new Error('injected fault: read failed');
      return new Readable({
        read() {
          this.destroy(error);
        },
      });
    }
    return this.inner.read(ref);
  }

  async finish(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    context: FinishContext,
  ): Promise<boolean> {
    this.checkAlive('finish');
    return this.inner.finish(ref, outcome, context);
  }

  async listExpired(now: number, limit: number): Promise<SequenceRef[]> {
    this.checkAlive('listExpired');
    return this.inner.listExpired(now, limit);
  }

  async expire(
    ref: SequenceRef,
    now: number,
    retentionMs: number,
  ): Promise<ExpiredSequence | null> {
    this.checkAlive('expire');
    return this.inner.expire(ref, now, retentionMs);
  }

  async stats(now: number): Promise<SequenceStoreStats> {
    return this.inner.stats(now);
  }

  async ping(): Promise<void> {
    this.checkAlive('ping');
    return this.inner.ping();
  }

  async close(): Promise<void> {
    return this.inner.close();
  }

  private checkAlive(call: string): void {
    if (!this.crashed) return;
    this.refusedAfterCrash.push(call);
    throw this.crashError();
  }

  private crashError(): Error {
    return new Error('injected fault: this consumer crashed');
  }
}

/** The most the store held while sampling. */
export interface StatsPeak {
  readonly maxOpenSequences: number;
  readonly maxBufferedBytes: number;
  readonly samples: number;
}

/**
 * Samples `store.stats()` on every turn of the event loop (messages are delivered on the same
 * turns) until `stop()`, which resolves to the peaks seen.
 */
export function sampleStats(store: SequenceStore): { stop(): Promise<StatsPeak> } {
  let stopped = false;
  let peak: StatsPeak = { maxOpenSequences: 0, maxBufferedBytes: 0, samples: 0 };
  const loop = (async () => {
    while (!stopped) {
      const stats = await store.stats(Date.now());
      peak = {
        maxOpenSequences: Math.max(peak.maxOpenSequences, stats.openSequences),
        maxBufferedBytes: Math.max(peak.maxBufferedBytes, stats.bufferedBytes),
        samples: peak.samples + 1,
      };
      await new Promise((resolve) => setImmediate(resolve));
    }
    return peak;
  })();
  return {
    stop: () => {
      stopped = true;
      return loop;
    },
  };
}
