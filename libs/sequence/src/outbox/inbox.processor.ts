import { setMaxListeners } from 'node:events';
import type { ResolvedTracing } from '../options/resolved-options';
import { OutboxTracing } from './outbox.tracing';
import type { InboxHandlers } from './inbox-handlers';
import type { OutboxMetrics } from './outbox.metrics';
import type { BoxLifecycle } from './outbox.events';
import type {
  BoxName,
  ClaimedBatch,
  OutboxStore,
  RecordOutcome,
  StoredRecord,
} from '../ports/outbox-store.port';
import { parseMessage } from './outbox-message.codec';
import { OutboxTransaction } from './outbox-transaction';
import type { ResolvedBoxOptions } from '../options/resolved-options';
import { BoxWorker, type CycleState } from './box-worker';
import { Logger } from '@nestjs/common';
import { ClaimCommitRefusedError } from '../core/errors/claim-commit-refused.error';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { ShutdownTimeoutError } from '../core/errors/shutdown-timeout.error';
import { InboxCallEndedError } from '../core/errors/inbox-call-ended.error';
import { InboxSessionEndedError } from '../core/errors/inbox-session-ended.error';
import { rememberRecent, rememberRecentEntry } from '../core/objects';
import { AbandonedCalls } from '../kernel/abandoned-calls';
import { callHandler, type HandlerContext, type HandlerTimeLimit } from '../kernel/handler-call';

/** The most records InboxProcessor keeps as handed back once after their session ended. */
const LOST_AFTER_CALL_KEPT = 10_000;
/** The most records InboxProcessor keeps as suspected, or found, to break their claim's COMMIT. */
const REFUSED_KEPT = 10_000;

/**
 * The processor of one inbox box: claims received records and runs their handler, one record at
 * a time, each inside a savepoint of the claim's transaction, then marks it `COMPLETED` in that
 * transaction. So a record is handled by one instance at a time; a handler that throws is undone
 * (what it wrote through the transaction) and retried later; and with `processInTransaction` the
 * handler's writes commit exactly when the record is marked done. If the process dies during a
 * handler, the claim rolls back and the record is handled again later; when a handler's statement
 * loses the claim's transaction (it outran `query_timeout`), the batch stops there and that
 * record alone counts a failed attempt. When the database refuses the claim's COMMIT (a deferred
 * constraint the handlers' writes break), the batch's records are handled one per claim, and the
 * one whose claim is refused alone counts the refusal as a failed attempt.
 */
export class InboxProcessor extends BoxWorker<'inbox_events' | 'inbox_commands'> {
  /**
   * Records handed back uncounted once because the database session ended after their handler
   * returned (most recent last, at most LOST_AFTER_CALL_KEPT): the next such end counts an
   * attempt, lest a handler that always outlasts a pooler's or the server's idle timeout run again
   * at every poll, for ever.
   */
  private readonly lostAfterCall = new Set<string>();
  /**
   * Records handled in a claim of several that the database refused to commit: each is handled
   * in a claim of its own until one commits, which tells whose writes it refuses (most recent
   * last, at most REFUSED_KEPT).
   */
  private readonly suspects = new Set<string>();
  /**
   * Records whose claim, handling them alone, the database refused to commit, with its error: the
   * next claim that holds one counts that as its failed attempt without calling the handler (the
   * refused transaction could not count it: it rolled back). At most REFUSED_KEPT.
   */
  private readonly refused = new Map<string, ClaimCommitRefusedError>();
  /**
   * An ordered box's handler calls past their time limit that still run, per partition: its
   * records are not handed to a handler until they return (released, due again at once), lest two
   * calls for one aggregate run at once in this process. Other partitions go on meanwhile.
   */
  private readonly abandoned = new AbandonedCalls();
  /**
   * The same per record, for the records of an unordered box (or without a partition key): a
   * record's retry is not handed to a handler while its abandoned call still runs.
   */
  private readonly abandonedRecords = new AbandonedCalls();
  /**
   * Aborted `graceMs` after {@link stop}: a handler call still running then is abandoned, and its
   * record handed back uncounted, so that the claim commits what was handled before it and the
   * shutdown goes on.
   */
  private readonly halted = haltSignal();
  private haltTimer?: NodeJS.Timeout;
  private graceMs = 0;
  private readonly logger = new Logger('Outbox');

  constructor(
    box: 'inbox_events' | 'inbox_commands',
    store: OutboxStore,
    private readonly handlers: InboxHandlers,
    options: ResolvedBoxOptions,
    metrics: OutboxMetrics,
    /** Boxes whose appends take partition locks (see `OutboxRuntime.orderedBoxes`). */
    private readonly orderedBoxes: ReadonlySet<BoxName>,
    lifecycle: BoxLifecycle,
    private readonly tracing: ResolvedTracing = { enabled: false, parent: 'link', maxLinks: 0 },
  ) {
    super(box, store, options, metrics, lifecycle);
  }

  override stop(graceMs?: number): void {
    super.stop();
    if (graceMs === undefined || this.haltTimer !== undefined) return;
    this.graceMs = graceMs;
    this.haltTimer = setTimeout(() => this.halted.abort(), graceMs);
    this.haltTimer.unref();
  }

  protected channelOf(record: StoredRecord): string {
    return this.handlers.find(record.kind, record.type)?.channel ?? '';
  }

  protected async handleBatch(batch: ClaimedBatch, cycle: CycleState): Promise<RecordOutcome[]> {
    const { records, outcomes, charged } = this.narrowed(batch.records);
    const handled: StoredRecord[] = [];
    cycle.committed = () => {
      for (const id of charged) this.refused.delete(id);
      // Claimed alone or in a batch that committed: none of them is what the database refused.
      for (const record of records) this.suspects.delete(record.id);
      for (const record of handled) this.metrics.processedOne(this.box, record.createdAt);
      for (const record of handled) this.lifecycle.handled(record, this.channelOf(record));
    };
    cycle.refused = (error) => this.refusedAtCommit(handled, error);
    const heldBack = new Set<string>();
    // Records handed to a handler, and those passed over while a call of their partition runs.
    let calls = 0;
    let waiting = 0;
    // What the batch's handlers recorded, written once at its end. Written record by record, an
    // ordered box's aggregate locks were taken in the order of the records, and held to the
    // claim's commit: a business transaction locking the same aggregates (in key order) deadlocked
    // with the batch. One write takes them all at once, in key order.
    const recorded = new OutboxTransaction(batch.transaction);
    try {
      // One savepoint around the handlers and that write: when the write fails, every handler's
      // writes go with it, and each handled record counts a failed attempt (retried, FAILED after
      // retry.attempts) rather than the whole claim failing again at every poll.
      await OutboxTransaction.inHandlerCalls(() =>
        batch.transaction.savepoint(async () => {
          for (const record of records) {
            if (this.stopping) break;
            if (record.partitionKey !== null && heldBack.has(record.partitionKey)) continue;
            if (this.abandonedRecords.has(record.id)) {
              waiting++;
              continue;
            }
            if (record.partitionKey !== null && this.abandoned.has(record.partitionKey)) {
              heldBack.add(record.partitionKey);
              waiting++;
              continue;
            }
            calls++;
            const outcome = await this.process(record, batch, recorded);
            outcomes.push(outcome);
            // The claim's transaction is lost (see below): nothing more can run in it.
            if (batch.transaction.brokenBy) return;
            if (outcome.status === 'completed') handled.push(record);
            else if (record.partitionKey !== null) heldBack.add(record.partitionKey);
          }
          // Events and commands the handlers recorded go out with their writes.
          await recorded.flush(this.store, this.orderedBoxes);
        }),
      );
      // Only records whose partition waits were claimed: the next claim waits for a wake-up or the
      // poll, rather than taking them again at once (and again, for as long as the call runs).
      if (waiting > 0 && calls === 0) cycle.holdOff = true;
    } catch (error) {
      if (!batch.transaction.brokenBy) {
        // Not handled after all: nothing of theirs commits.
        const undone = new Map(handled.splice(0).map((record) => [record.id, record]));
        return outcomes.map((outcome) => {
          const record = undone.get(outcome.id);
          return record ? this.failed(record, error) : outcome;
        });
      }
    }
    if (batch.transaction.brokenBy) {
      // A handler's statement outran query_timeout, or the connection failed: the claim's
      // transaction rolls back, and the records handled before it in this batch with it (their
      // writes and marks): they are handed out again, uncounted, rather than charged an attempt
      // they did not fail. The store writes the failed attempt of the record whose handler broke
      // it in a transaction of its own, so that the box moves on and a handler that always does
      // this ends FAILED after retry.attempts.
      handled.length = 0;
      return outcomes.filter((outcome) => outcome.status !== 'completed');
    }
    return outcomes;
  }

  /**
   * The records of a batch to handle, and the outcomes of the others. While it holds a record
   * suspected of breaking its claim's COMMIT, or found to, it handles one record, each refused
   * one counts its attempt (without a call), and the rest are released: due again at once.
   */
  private narrowed(batch: readonly StoredRecord[]): {
    records: readonly StoredRecord[];
    outcomes: RecordOutcome[];
    charged: string[];
  } {
    const outcomes: RecordOutcome[] = [];
    const charged: string[] = [];
    if (!batch.some((record) => this.refused.has(record.id) || this.suspects.has(record.id))) {
      return { records: batch, outcomes, charged };
    }
    const records: StoredRecord[] = [];
    // Partitions of an ordered box with an earlier record not handled in this claim.
    const heldBack = new Set<string>();
    for (const record of batch) {
      const refusal = this.refused.get(record.id);
      const held = record.partitionKey !== null && heldBack.has(record.partitionKey);
      if (!refusal && !held && records.length === 0) {
        records.push(record);
        continue;
      }
      if (refusal) charged.push(record.id);
      outcomes.push(refusal ? this.failed(record, refusal) : { id: record.id, status: 'released' });
      if (record.partitionKey !== null) heldBack.add(record.partitionKey);
    }
    return { records, outcomes, charged };
  }

  /**
   * The database refused to commit a claim after `handled` were handled: nothing of it was
   * written. One record alone is found: its next claim counts the attempt. Several are each
   * handled alone from now on, until the one refused is found.
   */
  private refusedAtCommit(
    handled: readonly StoredRecord[],
    error: ClaimCommitRefusedError,
  ): boolean {
    if (handled.length === 0) return false;
    if (handled.length === 1) {
      const [{ id }] = handled;
      this.suspects.delete(id);
      rememberRecentEntry(this.refused, id, error, REFUSED_KEPT);
      this.logger.warn(`${this.box}: ${error.message}; counted as a failed attempt of ${id}`);
    } else {
      for (const { id } of handled) rememberRecent(this.suspects, id, REFUSED_KEPT);
      this.logger.warn(
        `${this.box}: ${error.message}; its ${handled.length} records are handled one per ` +
          'claim to find whose writes it refuses',
      );
    }
    return true;
  }

  private async process(
    record: StoredRecord,
    batch: ClaimedBatch,
    recorded: OutboxTransaction,
  ): Promise<RecordOutcome> {
    const handler = this.handlers.find(record.kind, record.type);
    if (!handler) {
      // Received by an instance that had a handler (another version?): retried, so that one that
      // has it takes it, and FAILED after retry.attempts if none ever does.
      return this.failed(
        record,
        new Error(`no @InboxHandler for ${record.kind} ${record.type} on this instance`),
      );
    }
    let message;
    try {
      message = parseMessage(record.kind, record.body);
    } catch (error) {
      return this.failed(record, error, true);
    }
    const transaction = new OutboxTransaction(batch.transaction);
    const attempt = record.attempts + 1;
    const call = ({ signal }: HandlerContext) =>
      handler.handle(message, {
        id: record.id,
        kind: record.kind,
        type: record.type,
        headers: record.headers,
        attempt,
        receivedAt: new Date(record.createdAt),
        transaction: handler.processInTransaction ? transaction : undefined,
        signal,
      });
    const halt = this.haltedFor(handler.channel, `${record.kind} ${record.type} ${record.id}`);
    const limit: HandlerTimeLimit = {
      ms: handler.handlerTimeoutMs,
      until: halt.signal,
      error: (calls) =>
        new HandlerTimeoutError(
          handler.channel,
          `${record.kind} ${record.type} ${record.id}`,
          handler.handlerTimeoutMs!,
          calls,
        ),
      // Its savepoint rolls back now: what it would write later must not land in the claim's
      // transaction (with the next record's work, or this one's failed attempt), nor commit in
      // one of its own.
      abandoned: (settled) => {
        const halted = halt.signal.aborted;
        transaction.fail(halted ? (halt.signal.reason as Error) : limit.error(attempt));
        const partition = this.options.ordered ? record.partitionKey : null;
        if (partition === null) this.abandonedRecords.add(record.id, settled);
        else this.abandoned.add(partition, settled);
        this.logger.warn(
          halted
            ? `${this.box}: the handler was still running on ${record.id} ${this.graceMs} ms ` +
                'after the processor began to stop (shutdownTimeoutMs); abandoned, its record ' +
                'is handed back uncounted'
            : `${this.box}: the handler ran past handlerTimeoutMs (${handler.handlerTimeoutMs} ` +
                `ms) on ${record.id}; ${partition === null ? 'its retry' : `aggregate ${partition}`} ` +
                'waits until the call returns',
        );
      },
    };
    let called = false;
    let returned = false;
    try {
      await batch.transaction.savepoint(async () => {
        called = true;
        // Open while the handler runs: an OutboxService.transaction inside it records into it.
        // Joinable only until the handler's call settles (or is abandoned): what it left running
        // opens its own once the call returned, and is refused once it failed.
        await batch.handlerCall(() =>
          OutboxTracing.process(this.tracing, this.box, handler.channel, record, () =>
            OutboxTransaction.asHandlerCall(transaction, () =>
              transaction.within(() => callHandler(call, attempt, limit)),
            ),
          ),
        );
        // Returned with the connection still usable as far as its statements saw: a statement of
        // its own that broke it (outran query_timeout, error swallowed) still counts an attempt.
        returned = !batch.transaction.brokenBy;
      });
    } catch (error) {
      // What the failed call left running must not land in the next record's savepoint, nor
      // commit in a transaction() of its own beside the retry.
      transaction.fail(new InboxCallEndedError(record.id, 'failed'));
      // Abandoned by the shutdown, not failed: due again, here after a restart or elsewhere.
      if (halt.signal.aborted && error === halt.signal.reason) {
        return { id: record.id, status: 'released' };
      }
      // The connection failed before the handler was called (at its SAVEPOINT): not an attempt.
      if (!called && batch.transaction.brokenBy) return { id: record.id, status: 'released' };
      // Or after it returned (at the RELEASE: a failover, a terminated session): the handler did
      // not fail. Handed back uncounted once; the same end again counts an attempt.
      if (returned && batch.transaction.brokenBy) {
        if (this.lostAfterCall.delete(record.id)) {
          return this.failed(record, new InboxSessionEndedError(record.id, error));
        }
        rememberRecent(this.lostAfterCall, record.id, LOST_AFTER_CALL_KEPT);
        return { id: record.id, status: 'released' };
      }
      this.lostAfterCall.delete(record.id);
      return this.failed(record, error);
    } finally {
      halt.done();
    }
    this.lostAfterCall.delete(record.id);
    // Kept only once its savepoint is released: a handler undone takes its messages with it.
    recorded.adopt(transaction);
    transaction.abandon(new InboxCallEndedError(record.id, 'completed'));
    return { id: record.id, status: 'completed' };
  }

  /**
   * {@link halted} as the call on `subject` sees it: aborted with a ShutdownTimeoutError naming
   * it. `done` once the call ended.
   */
  private haltedFor(channel: string, subject: string): { signal: AbortSignal; done(): void } {
    const controller = new AbortController();
    const halt = () => controller.abort(new ShutdownTimeoutError(channel, subject, this.graceMs));
    if (this.halted.signal.aborted) halt();
    else this.halted.signal.addEventListener('abort', halt, { once: true });
    return {
      signal: controller.signal,
      done: () => this.halted.signal.removeEventListener('abort', halt),
    };
  }
}

/** The processor's halt: one listener per call in progress, as many as its concurrency. */
function haltSignal(): AbortController {
  const controller = new AbortController();
  setMaxListeners(0, controller.signal);
  return controller;
}
