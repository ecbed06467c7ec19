/**
 * A PayloadStore that notes when the library calls it, for the Claim Check benchmark's phases.
 * It forwards every call unchanged (same arguments, same results, same streams) and keeps the
 * inner store's name, so tickets and the receiver's store lookup are as without it.
 */
import type { Readable } from 'node:stream';
import type {
  PayloadInfo,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
} from 'nest-sequence/ports';
import type { PayloadStore } from 'nest-sequence';

/** Receives `<operation>Start` / `<operation>End` marks (e.g. `putStart`, `deleteEnd`). */
export type MarkFn = (name: string) => void;

export class TracedPayloadStore implements PayloadStore {
  readonly name: string;

  /** The inner store's, when it has one: without, the sweeper's fallback goes through head. */
  readonly deleteUnpublished?: (ref: string) => Promise<boolean>;

  constructor(
    private readonly inner: PayloadStore,
    private readonly mark: MarkFn,
  ) {
    this.name = inner.name;
    const deleteUnpublished = inner.deleteUnpublished?.bind(inner);
    if (deleteUnpublished) {
      this.deleteUnpublished = (ref) =>
        this.timed('deleteUnpublished', () => deleteUnpublished(ref));
    }
  }

  put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    return this.timed('put', () => this.inner.put(payload, options));
  }

  /** Marks `getStart` / `getEnd` (the file is open), and `streamEnd` when its stream ended. */
  async get(ref: string): Promise<Readable> {
    const stream = await this.timed('get', () => this.inner.get(ref));
    stream.once('end', () => this.mark('streamEnd'));
    return stream;
  }

  head(ref: string): Promise<PayloadInfo | undefined> {
    return this.timed('head', () => this.inner.head(ref));
  }

  delete(ref: string): Promise<boolean> {
    return this.timed('delete', () => this.inner.delete(ref));
  }

  markPublished(ref: string): Promise<boolean> {
    return this.timed('markPublished', () => this.inner.markPublished(ref));
  }

  sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    return this.inner.sweepCandidates(query);
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  private async timed<T>(operation: string, call: () => Promise<T>): Promise<T> {
    this.mark(`${operation}Start`);
    const result = await call();
    this.mark(`${operation}End`);
    return result;
  }
}
