import { Inject, Injectable } from '@nestjs/common';
import { RESOLVED_OPTIONS } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { OutboxTracing } from './outbox.tracing';
import type { BoxName, BoxStats, SqlExecutor, StoredRecord } from '../ports/outbox-store.port';
import type { CommandInput, EventInput } from '../core/outbox-message';
import { commandRecord, eventRecord, toCommand, toEvent } from './outbox-message.codec';
import {
  checkedHeaders,
  lockPartitionsOf,
  OutboxTransaction,
  type MessageHeaders,
} from './outbox-transaction';
import { OutboxRuntime } from './outbox.runtime';

/** Where `publishEvent` / `sendCommand` write when called outside `transaction`. */
export interface JoinOptions {
  /**
   * The transaction to join: yours, already open (`BEGIN` sent) and committed by you — anything
   * with `pg`'s `query(text, values)`; or an {@link OutboxTransaction}. PostgreSQL only for yours.
   */
  readonly client: SqlExecutor | OutboxTransaction;
  readonly headers?: MessageHeaders;
}

/**
 * The producer side of the Transactional Outbox: records events and commands in the same database
 * transaction as the business change that caused them; relays publish them after the commit (at
 * least once, ids stable across retries), and never if it rolls back.
 *
 * @example
 * await outbox.transaction(async (tx) => {
 *   await tx.query('INSERT INTO orders (id, total) VALUES ($1, $2)', [order.id, order.total]);
 *   tx.publishEvent({ type: 'OrderPlaced', aggregateType: 'Order', aggregateId: order.id, payload: order });
 * });
 */
@Injectable()
export class OutboxService {
  constructor(
    private readonly runtime: OutboxRuntime,
    @Inject(RESOLVED_OPTIONS) private readonly resolved: ResolvedOptions,
  ) {}

  /**
   * Runs `work` in one transaction of the outbox store: commits when it resolves (the business
   * writes and the recorded messages together), rolls back when it throws (and rethrows). Inside
   * another transaction of the store (or an inbox handler's), it joins it as a savepoint: what it
   * recorded is then written with the enclosing transaction's records, after those recorded
   * before it, and what any transaction recorded inside it is dropped if it throws. Started by
   * an inbox handler call once it failed (by work it left running), it is refused: with the
   * call's `HandlerTimeoutError` when it ran past its `handlerTimeoutMs`, with an
   * `InboxCallEndedError` when it threw.
   */
  transaction<T>(work: (transaction: OutboxTransaction) => Promise<T>): Promise<T> {
    return OutboxTracing.append(this.resolved.tracing, 'transaction', () =>
      this.inTransaction(work),
    );
  }

  private async inTransaction<T>(work: (transaction: OutboxTransaction) => Promise<T>): Promise<T> {
    // Started by an inbox handler call that failed: nothing of it may commit beside the retry.
    OutboxTransaction.assertCallNotFailed();
    const store = await this.runtime.ready();
    let restore: (() => void) | undefined;
    let result: T;
    try {
      result = await store.transaction(async (storeTransaction) => {
        const enclosing = OutboxTransaction.innermostOn(storeTransaction);
        restore = OutboxTransaction.saveRecordedOn(storeTransaction);
        const call = OutboxTransaction.handlerCallOn(storeTransaction);
        const transaction = new OutboxTransaction(storeTransaction, enclosing, call);
        let value: T;
        try {
          value = await transaction.within(() => work(transaction));
        } finally {
          // What the work left running is refused from now on: see OutboxTransaction.finish.
          transaction.finish();
        }
        // The store wakes the relays of what it wrote once it commits (OutboxStore.watch).
        if (enclosing) enclosing.adopt(transaction);
        else await transaction.flush(store, this.runtime.orderedBoxes);
        return value;
      });
    } catch (error) {
      // Joined as a savepoint that rolled back (its work threw, or releasing it failed after):
      // what was recorded during it, adopted or not, goes with its writes.
      restore?.();
      throw error;
    }
    return result;
  }

  /**
   * Records an event in a transaction you opened (`options.client`); it is published after your
   * commit. Resolves with its id once the row is written (not yet committed).
   */
  async publishEvent<Payload>(event: EventInput<Payload>, options: JoinOptions): Promise<string> {
    options ??= {} as JoinOptions; // the store refuses the missing client with a typed error
    if (options.client instanceof OutboxTransaction) {
      return options.client.publishEvent(event, options.headers);
    }
    return OutboxTracing.append(this.resolved.tracing, 'event', () =>
      this.appendEvent(event, options),
    );
  }

  private async appendEvent<Payload>(
    event: EventInput<Payload>,
    options: JoinOptions,
  ): Promise<string> {
    const record = eventRecord(toEvent(event), checkedHeaders('event', options.headers ?? {}));
    const store = await this.runtime.ready();
    if (this.runtime.orderedBoxes.has('outbox_events')) {
      await lockPartitionsOf(store, 'outbox_events', [record], options.client);
    }
    await store.append('outbox_events', [record], options.client);
    return record.id;
  }

  /** Records a command in a transaction you opened; see {@link publishEvent}. */
  async sendCommand<Payload>(
    command: CommandInput<Payload>,
    options: JoinOptions,
  ): Promise<string> {
    options ??= {} as JoinOptions; // the store refuses the missing client with a typed error
    if (options.client instanceof OutboxTransaction) {
      return options.client.sendCommand(command, options.headers);
    }
    return OutboxTracing.append(this.resolved.tracing, 'command', () =>
      this.appendCommand(command, options),
    );
  }

  private async appendCommand<Payload>(
    command: CommandInput<Payload>,
    options: JoinOptions,
  ): Promise<string> {
    const record = commandRecord(
      toCommand(command),
      checkedHeaders('command', options.headers ?? {}),
    );
    const store = await this.runtime.ready();
    await store.append('outbox_commands', [record], options.client);
    return record.id;
  }

  /** One record of a box, by message id. */
  async record(box: BoxName, id: string): Promise<StoredRecord | undefined> {
    return (await this.runtime.ready()).get(box, id);
  }

  /** `FAILED` records of a box, oldest first: what needs an operator. */
  async failed(box: BoxName, limit = 100): Promise<StoredRecord[]> {
    return (await this.runtime.ready()).listFailed(box, limit);
  }

  /** Puts `FAILED` records back to `PENDING` (attempts reset), and wakes the box's worker. */
  async retry(box: BoxName, ids: readonly string[]): Promise<number> {
    const count = await (await this.runtime.ready()).retry(box, ids, Date.now());
    this.runtime.wake(box);
    return count;
  }

  /** Pending and failed counts, and the oldest pending record's time. */
  async stats(box: BoxName): Promise<BoxStats> {
    return (await this.runtime.ready()).stats(box);
  }
}
