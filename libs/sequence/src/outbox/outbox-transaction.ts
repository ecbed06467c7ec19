import { AsyncLocalStorage } from 'node:async_hooks';
import { hasLoneSurrogate } from '../core/unicode';
import { InvalidOutboxMessageError } from '../core/errors/invalid-outbox-message.error';
import {
  OutboxTransactionFinishedError,
  type FinishedTransactionUse,
} from '../core/errors/outbox-transaction-finished.error';
import {
  BOX_NAMES,
  type BoxName,
  type MessageKind,
  type NewBoxRecord,
  type OutboxDialect,
  type OutboxStore,
  type SqlExecutor,
  type StoreTransaction,
} from '../ports/outbox-store.port';
import type { CommandInput, EventInput } from '../core/outbox-message';
import { commandRecord, eventRecord, toCommand, toEvent } from './outbox-message.codec';

/** Headers given with a message: strings only (they travel as AMQP headers). */
export type MessageHeaders = Readonly<Record<string, string>>;

/**
 * One database transaction of the outbox store, as `OutboxService.transaction` hands it to your
 * code: write your business data through `query` (or the driver's own `client`), and record the
 * events and commands that announce it with `publishEvent` and `sendCommand`. They are validated
 * at once (an invalid one throws `InvalidOutboxMessageError` there) and written to the outbox
 * tables just before the commit, in the same transaction: they are published if and only if it
 * commits.
 */
export class OutboxTransaction {
  private readonly queued = new Map<BoxName, NewBoxRecord[]>();
  /** Set once the records were written: later ones could not be, so they are refused. */
  private flushed = false;
  /** Set when the handler this was handed to was abandoned: everything is refused with it. */
  private abandonedBy: Error | undefined;
  /** Set when the handler call this was handed to failed: see {@link fail}. */
  private failedBy: Error | undefined;
  /**
   * Set once the work of the `transaction()` this was handed to has returned or thrown: what that
   * work left running is refused everything from then on, here and in the transactions joined
   * inside it, rather than run outside the transaction (its connection back in the pool) or in
   * the enclosing one, which a nested one's work that ended is no longer part of.
   */
  private finished = false;

  /**
   * @param enclosing the transaction this one was opened inside (a joined `transaction()`): once
   *   that one is abandoned, so is this one.
   * @param call the inbox handler call whose async context opened this one on the claim's
   *   transaction (see {@link handlerCallOn}): abandoned with it too. It joined after the call
   *   returned when `enclosing` is not that call (another record's call, or none).
   */
  constructor(
    private readonly transaction: StoreTransaction,
    private readonly enclosing?: OutboxTransaction,
    private readonly call?: OutboxTransaction,
  ) {}

  /**
   * Runs the inbox handler call `work` as `call`'s, for everything it starts: see
   * {@link handlerCallOn}. Within {@link inHandlerCalls}.
   */
  static asHandlerCall<T>(call: OutboxTransaction, work: () => Promise<T>): Promise<T> {
    return CALLS.run(call, work);
  }

  /**
   * Runs `work`, a claim's handler calls, with the handler-call context on: on only while claims
   * run, or a failed call may (see {@link fail}), since Node tracks async context for every
   * promise while it is on. Work a call that returned left running past its claim finds no call
   * then; it finds no claim to join either.
   */
  static async inHandlerCalls<T>(work: () => Promise<T>): Promise<T> {
    callsRunning++;
    try {
      return await work();
    } finally {
      callsEnded();
    }
  }

  /**
   * Throws when the async context is that of an inbox handler call that failed (see
   * {@link fail}): a `transaction()` it starts is refused.
   */
  static assertCallNotFailed(): void {
    const failed = CALLS.getStore()?.failedBy;
    if (failed) throw failed;
  }

  /**
   * The inbox handler call whose async context is running, when it runs on `storeTransaction`
   * (the claim's): what a `transaction()` it started joins, whenever that is.
   */
  static handlerCallOn(storeTransaction: StoreTransaction): OutboxTransaction | undefined {
    const call = CALLS.getStore();
    return call?.transaction === storeTransaction ? call : undefined;
  }

  /**
   * The innermost outbox transaction whose work is running on `storeTransaction`: a nested
   * `OutboxService.transaction` hands its records to it rather than writing them itself.
   */
  static innermostOn(storeTransaction: StoreTransaction): OutboxTransaction | undefined {
    return OPEN.get(storeTransaction)?.at(-1);
  }

  /**
   * Saves the recorded messages of every outbox transaction open on `storeTransaction`; the
   * returned function puts them back. Around a savepoint: what was recorded inside one that rolls
   * back must go with its writes, whichever transaction object recorded it.
   */
  static saveRecordedOn(storeTransaction: StoreTransaction): () => void {
    // Queues only grow while work runs (they are written at the end): their lengths suffice.
    const saved = (OPEN.get(storeTransaction) ?? []).map(
      (open) =>
        [open, new Map([...open.queued].map(([box, records]) => [box, records.length]))] as const,
    );
    return () => {
      for (const [open, lengths] of saved) {
        for (const [box, records] of open.queued) {
          const length = lengths.get(box) ?? 0;
          if (length === 0) open.queued.delete(box);
          else records.length = length;
        }
      }
    };
  }

  /** Runs `work` with this transaction open on its store transaction (see `innermostOn`). */
  async within<T>(work: () => Promise<T>): Promise<T> {
    const open = OPEN.get(this.transaction) ?? [];
    OPEN.set(this.transaction, open);
    open.push(this);
    try {
      return await work();
    } finally {
      open.splice(open.lastIndexOf(this), 1);
      if (open.length === 0) OPEN.delete(this.transaction);
    }
  }

  /**
   * Takes over what a nested transaction recorded, after its own: they are written together, in
   * the order they were recorded, so that one aggregate's events keep that order.
   */
  adopt(nested: OutboxTransaction): void {
    nested.flushed = true;
    for (const [box, records] of nested.queued) {
      for (const record of records) this.queue(box, record);
    }
    nested.queued.clear();
  }

  /**
   * The inbox handler call this was handed to is over (it ran past its `handlerTimeoutMs`, threw,
   * or returned): from now on every statement, savepoint, message and access to `client`, here
   * and on the transactions joined inside it, is refused with `reason`, so that what the call
   * left running cannot land in the claim's transaction, which has moved on to other records.
   */
  abandon(reason: Error): void {
    this.abandonedBy ??= reason;
    this.flushed = true;
    this.queued.clear();
  }

  /**
   * The inbox handler call this was handed to failed (it threw, or ran past its time limit), and
   * its record is to be handled again: {@link abandon}ed with `reason`, and a `transaction()`
   * started from its async context from now on, by the call or by work it left running, is
   * refused with it too. Opening one of its own, that work would commit what the failed attempt
   * undid, and the retry would write it again. The handler-call context stays on for as long as
   * anything of the call can run: until this object is garbage (each async resource created in
   * the call's context holds it). Work a call left running once it returned does open its own.
   */
  fail(reason: Error): void {
    this.abandon(reason);
    if (this.failedBy) return;
    this.failedBy = reason;
    callsRunning++;
    FAILED_CALLS.register(this, undefined);
  }

  /**
   * The work of the `transaction()` this was handed to has returned or thrown: see `finished`.
   * What it recorded is still written (`flush`) or handed to the enclosing one (`adopt`).
   */
  finish(): void {
    this.finished = true;
  }

  get dialect(): OutboxDialect {
    return this.transaction.dialect;
  }

  /**
   * Why `use` is refused: this transaction, the call that opened it, or one it was opened inside,
   * was abandoned, or its work is over.
   */
  private abandonment(use: FinishedTransactionUse, type?: string): Error | undefined {
    if (this.abandonedBy) return this.abandonedBy;
    if (this.finished) return new OutboxTransactionFinishedError(use, type);
    return this.call?.abandonment(use, type) ?? this.enclosing?.abandonment(use, type);
  }

  /** The driver's handle: a `pg` `PoolClient` inside `BEGIN`, or the `better-sqlite3` `Database`. */
  get client(): unknown {
    const abandoned = this.abandonment('client');
    if (abandoned) throw abandoned;
    return this.transaction.client;
  }

  /** Runs one statement in this transaction (`$1` placeholders on PostgreSQL, `?` on SQLite). */
  query<Row = Record<string, unknown>>(
    sql: string,
    params?: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }> {
    const abandoned = this.abandonment('statement');
    if (abandoned) return Promise.reject(abandoned);
    return this.transaction.query<Row>(sql, params);
  }

  /**
   * Runs `work` in a savepoint: when it throws, its writes are undone, and so are the events and
   * commands recorded during it; the error is rethrown.
   */
  async savepoint<T>(work: () => Promise<T>): Promise<T> {
    const abandoned = this.abandonment('savepoint');
    if (abandoned) throw abandoned;
    const restore = OutboxTransaction.saveRecordedOn(this.transaction);
    try {
      return await this.transaction.savepoint(work);
    } catch (error) {
      restore();
      // Abandoned meanwhile, the call's writes were rolled back, this savepoint with them: the
      // time limit is what ended it. (A function: `abandonedBy` read directly stays narrowed.)
      throw this.abandonment('savepoint') ?? error;
    }
  }

  /** Records an event, published after the commit; returns its id. */
  publishEvent<Payload>(event: EventInput<Payload>, headers: MessageHeaders = {}): string {
    const record = eventRecord(toEvent(event), checkedHeaders('event', headers));
    this.queue('outbox_events', record);
    return record.id;
  }

  /** Records a command, sent after the commit; returns its id. */
  sendCommand<Payload>(command: CommandInput<Payload>, headers: MessageHeaders = {}): string {
    const record = commandRecord(toCommand(command), checkedHeaders('command', headers));
    this.queue('outbox_commands', record);
    return record.id;
  }

  /**
   * Writes what was recorded into the outbox tables (called before the commit); the store wakes
   * their relays once the transaction commits.
   */
  async flush(store: OutboxStore, ordered: ReadonlySet<BoxName> = new Set()): Promise<void> {
    this.flushed = true;
    // Boxes in one fixed order, whatever was recorded first: two transactions that write to two
    // ordered boxes take their locks in the same order, and cannot deadlock.
    const boxes = BOX_NAMES.filter((box) => this.queued.has(box));
    for (const box of boxes) {
      const records = this.queued.get(box)!;
      this.queued.delete(box);
      if (ordered.has(box)) await lockPartitionsOf(store, box, records, this.transaction);
      // With the commit when the store can: the last writes of the transaction, whose result
      // nobody waits for.
      if (store.appendAtCommit) await store.appendAtCommit(box, records, this.transaction);
      else await store.append(box, records, this.transaction);
    }
  }

  private queue(box: BoxName, record: NewBoxRecord): void {
    const abandoned = this.abandonment(record.kind, record.type);
    if (abandoned) throw abandoned;
    if (this.flushed) throw new OutboxTransactionFinishedError(record.kind, record.type);
    const records = this.queued.get(box) ?? [];
    records.push(record);
    this.queued.set(box, records);
  }
}

/** The outbox transactions whose work is running, per store transaction, outermost first. */
const OPEN = new WeakMap<StoreTransaction, OutboxTransaction[]>();

/** The inbox handler call of the async context (see `OutboxTransaction.handlerCallOn`). */
const CALLS = new AsyncLocalStorage<OutboxTransaction>();
/**
 * Claims whose handler calls are running, and failed calls that something may still run in (see
 * `OutboxTransaction.fail`); the context is turned off when this falls to 0.
 */
let callsRunning = 0;
/** Counts a failed call off {@link callsRunning} once nothing can run in its context any more. */
const FAILED_CALLS = new FinalizationRegistry<undefined>(() => callsEnded());

/** One of {@link callsRunning} ended. */
function callsEnded(): void {
  if (--callsRunning === 0) CALLS.disable();
}

/**
 * Takes the partition locks of `records` (ordered boxes): a later transaction appending to the same
 * aggregate waits for this one's commit, so append order is commit order.
 */
export async function lockPartitionsOf(
  store: OutboxStore,
  box: BoxName,
  records: readonly NewBoxRecord[],
  within: StoreTransaction | SqlExecutor,
): Promise<void> {
  const keys = [...new Set(records.map((r) => r.partitionKey).filter((k) => k !== null))];
  if (keys.length > 0) await store.lockPartitions?.(box, keys, within);
}

/** Headers must be string-valued: anything else is refused at once, not at publish time. */
export function checkedHeaders(kind: MessageKind, headers: MessageHeaders): MessageHeaders {
  const problems: string[] = [];
  for (const [name, value] of Object.entries(headers as Record<string, unknown>)) {
    if (typeof value !== 'string') {
      problems.push(`header ${name} must be a string, got ${typeof value}`);
    } else if (name.includes('\u0000') || value.includes('\u0000')) {
      // Stored as jsonb on PostgreSQL, which refuses an escaped NUL.
      problems.push(`header ${name} must not contain the NUL character (U+0000)`);
    } else if (hasLoneSurrogate(name) || hasLoneSurrogate(value)) {
      // Which jsonb refuses too, and UTF-8 cannot carry.
      problems.push(`header ${name} must be well-formed Unicode (it has a lone surrogate)`);
    }
  }
  if (problems.length > 0) throw new InvalidOutboxMessageError(kind, problems);
  return { ...headers };
}
