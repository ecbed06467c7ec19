import { asError } from '../../../core/errors/caught';
/**
 * Gathers calls made within one turn of the event loop into batches, one per group, sent together
 * once the turn's I/O callbacks have run (`setImmediate`), or as soon as a group holds `maxSize`.
 * A consumer that is handed a burst of deliveries at once thus makes one call for the burst
 * instead of one each; a lone call waits no longer than the rest of its turn.
 *
 * `send` answers each item's outcome, in order, or rejects for the whole batch.
 */
export class TickBatches<T, R> {
  private readonly waiting = new Map<string, Waiting<T, R>[]>();
  private scheduled = false;

  constructor(
    private readonly maxSize: number,
    private readonly send: (items: readonly T[]) => Promise<readonly PromiseSettledResult<R>[]>,
  ) {
    if (!Number.isSafeInteger(maxSize) || maxSize < 1) {
      throw new RangeError(`maxSize must be a positive integer, got ${maxSize}`);
    }
  }

  /** `item`'s outcome, once the batch of `group` it joins has been sent. */
  add(group: string, item: T): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      let batch = this.waiting.get(group);
      if (!batch) this.waiting.set(group, (batch = []));
      batch.push({ item, resolve, reject });
      if (batch.length >= this.maxSize) {
        this.waiting.delete(group);
        this.dispatch(batch);
      } else if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    const batches = [...this.waiting.values()];
    this.waiting.clear();
    for (const batch of batches) this.dispatch(batch);
  }

  private dispatch(batch: Waiting<T, R>[]): void {
    let sent: Promise<readonly PromiseSettledResult<R>[]>;
    try {
      sent = this.send(batch.map(({ item }) => item));
    } catch (error) {
      sent = Promise.reject(asError(error));
    }
    sent.then(
      (outcomes) =>
        batch.forEach(({ resolve, reject }, i) => {
          const outcome = outcomes[i];
          if (outcome?.status === 'fulfilled') resolve(outcome.value);
          else reject(outcome ? outcome.reason : new Error('the batch answered too few outcomes'));
        }),
      (error: unknown) => batch.forEach(({ reject }) => reject(error)),
    );
  }
}

interface Waiting<T, R> {
  readonly item: T;
  readonly resolve: (value: R) => void;
  readonly reject: (reason: unknown) => void;
}
