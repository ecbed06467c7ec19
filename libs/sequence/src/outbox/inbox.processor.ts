import type { InboxHandlerRegistry } from '../discovery/inbox-handler.registry';
import type { OutboxMetrics } from '../observability/outbox.metrics';
import type {
  BoxName,
  ClaimedBatch,
  OutboxStore,
  RecordOutcome,
  StoredRecord,
} from '../ports/outbox-store.port';
import type { InboxContext } from './inbox-handler.options';
import { parseMessage } from './outbox-message.codec';
import { OutboxTransaction } from './outbox-transaction';
import type { ResolvedBoxOptions } from './outbox.options';
import { BoxWorker } from './box-worker';

/**
 * The processor of one inbox box: claims received records and runs their handler, one record at
 * a time, each inside a savepoint of the claim's transaction, then marks it `COMPLETED` in that
 * transaction. So a record is handled by one instance at a time; a handler that throws is undone
 * (what it wrote through the transaction) and retried later; and with `processInTransaction` the
 * handler's writes commit exactly when the record is marked done. If the process dies during a
 * handler, the claim rolls back and the record is handled again later.
 */
export class InboxProcessor extends BoxWorker<'inbox_events' | 'inbox_commands'> {
  constructor(
    box: 'inbox_events' | 'inbox_commands',
    store: OutboxStore,
    private readonly handlers: InboxHandlerRegistry,
    options: ResolvedBoxOptions,
    metrics: OutboxMetrics,
    /** Boxes whose appends take partition locks (see `OutboxRuntime.orderedBoxes`). */
    private readonly orderedBoxes: ReadonlySet<BoxName>,
  ) {
    super(box, store, options, metrics);
  }

  protected async handleBatch(batch: ClaimedBatch): Promise<RecordOutcome[]> {
    const outcomes: RecordOutcome[] = [];
    const handled: StoredRecord[] = [];
    const heldBack = new Set<string>();
    // What the batch's handlers recorded, written once at its end. Written record by record, an
    // ordered box's aggregate locks were taken in the order of the records, and held to the
    // claim's commit: a business transaction locking the same aggregates (in key order) deadlocked
    // with the batch. One write takes them all at once, in key order.
    const recorded = new OutboxTransaction(batch.transaction);
    try {
      // One savepoint around the handlers and that write: when the write fails, every handler's
      // writes go with it, and each handled record counts a failed attempt (retried, FAILED after
      // maxAttempts) rather than the whole claim failing again at every poll.
      await batch.transaction.savepoint(async () => {
        for (const record of batch.records) {
          if (this.stopping) break;
          if (record.partitionKey !== null && heldBack.has(record.partitionKey)) continue;
          const outcome = await this.process(record, batch, recorded);
          outcomes.push(outcome);
          if (outcome.status === 'completed') handled.push(record);
          else if (record.partitionKey !== null) heldBack.add(record.partitionKey);
        }
        // Events and commands the handlers recorded go out with their writes.
        await recorded.flush(this.store, this.orderedBoxes);
      });
    } catch (error) {
      const undone = new Map(handled.map((record) => [record.id, record]));
      return outcomes.map((outcome) => {
        const record = undone.get(outcome.id);
        return record ? this.failed(record, error) : outcome;
      });
    }
    for (const record of handled) this.metrics.processedOne(this.box, record.createdAt);
    return outcomes;
  }

  private async process(
    record: StoredRecord,
    batch: ClaimedBatch,
    recorded: OutboxTransaction,
  ): Promise<RecordOutcome> {
    const handler = this.handlers.find(record.kind, record.type);
    if (!handler) {
      // Received by an instance that had a handler (another version?): retried, so that one that
      // has it takes it, and FAILED after maxAttempts if none ever does.
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
    const context: InboxContext = {
      id: record.id,
      kind: record.kind,
      type: record.type,
      headers: record.headers,
      attempt: record.attempts + 1,
      receivedAt: new Date(record.createdAt),
      transaction: handler.processInTransaction ? transaction : undefined,
    };
    try {
      await batch.transaction.savepoint(async () => {
        // Open while the handler runs: an OutboxService.transaction inside it records into it.
        // Joinable only until the handler's promise settles: what it left running opens its own.
        await batch.handlerCall(() =>
          transaction.within(async () => handler.handle(message, context)),
        );
      });
    } catch (error) {
      return this.failed(record, error);
    }
    // Kept only once its savepoint is released: a handler undone takes its messages with it.
    recorded.adopt(transaction);
    return { id: record.id, status: 'completed' };
  }
}
