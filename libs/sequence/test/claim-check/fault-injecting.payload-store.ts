import { Readable, Transform } from 'node:stream';
import {
  deleteIfUnpublished,
  type PayloadInfo,
  type PutOptions,
  type StoredPayload,
  type SweepCandidate,
  type SweepQuery,
} from 'nest-sequence/ports';
import type { PayloadStore } from 'nest-sequence';

/**
 * A {@link PayloadStore} around a real one that fails on command, as an unreachable store does:
 * a plain `Error` (not a typed "not found"), before the call reaches the inner store. Counts are
 * of upcoming calls; each failure uses one up.
 */
export class FaultInjectingPayloadStore implements PayloadStore {
  readonly name: string;
  /** Upcoming `head` and `get` calls that fail (reads share one budget). */
  failReads = 0;
  /** Upcoming `get` calls that fail, `head` unaffected. */
  failGets = 0;
  failDeletes = 0;
  /** Upcoming `put` calls that fail before reading the payload. */
  failPuts = 0;
  /** Upcoming `markPublished` calls that fail. */
  failMarks = 0;
  /** Upcoming `sweepCandidates` calls that fail. */
  failSweeps = 0;
  /** Upcoming `head` calls that never settle, as on a store that stopped answering. */
  hangHeads = 0;
  /** Upcoming `get` calls that never settle (a stalled S3 GET, a Redis that stopped answering). */
  hangGets = 0;
  /** Upcoming `delete` calls that never settle, the payload kept. */
  hangDeletes = 0;
  /** Upcoming `markPublished` calls that never settle, the payload left unmarked. */
  hangMarks = 0;
  /**
   * Upcoming `put` calls that take none of the payload and do not settle until
   * {@link releasePuts}, which hands it to the inner store then: a store that stopped answering
   * mid-upload, and answers again later.
   */
  hangPuts = 0;
  private readonly hungPuts: Array<{ release: () => void; settled: Promise<unknown> }> = [];
  /**
   * The next `put` of a stream reads this many bytes of it, exactly, then neither reads on (not
   * even its end) nor settles: a store frozen once it had the bytes.
   */
  stallPutsAfter: number | undefined;
  /** `put`s take each chunk of a stream this long after the one before: a slow, steady store. */
  putChunkDelayMs = 0;
  /**
   * Upcoming `get` calls whose stream hands over the payload's first chunk, then nothing more,
   * ever (a connection that stalled mid-body). Those streams are kept in {@link stalled}.
   */
  stallStreams = 0;
  /** The streams that stalled, to check that the reader let go of them. */
  readonly stalled: Readable[] = [];
  /** `sweepCandidates` calls do not settle (as on a hung network mount) until {@link releaseSweeps}. */
  hangSweeps = false;
  private readonly hungSweeps: Array<() => void> = [];
  readonly calls = { head: 0, get: 0, delete: 0 };

  /** @param name another name than the inner store's, e.g. to list two stores of one kind */
  constructor(
    readonly inner: PayloadStore,
    name: string = inner.name,
  ) {
    this.name = name;
  }

  async put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    if (this.failPuts > 0) {
      this.failPuts--;
      throw new Error('payload store unreachable (put, injected by the test)');
    }
    if (this.hangPuts > 0) {
      this.hangPuts--;
      let release!: () => void;
      const put = new Promise<void>((resolve) => (release = resolve)).then(() =>
        this.inner.put(payload, options),
      );
      this.hungPuts.push({ release, settled: put.catch(() => undefined) });
      return put;
    }
    if (this.stallPutsAfter !== undefined && payload instanceof Readable) {
      const bytes = this.stallPutsAfter;
      this.stallPutsAfter = undefined;
      return readThenStall(payload, bytes);
    }
    if (this.putChunkDelayMs > 0 && payload instanceof Readable) {
      const delayMs = this.putChunkDelayMs;
      const delayed = new Transform({
        transform: (chunk: Buffer, _encoding, done) => setTimeout(() => done(null, chunk), delayMs),
      });
      payload.on('error', (error) => delayed.destroy(error));
      return this.inner.put(payload.pipe(delayed), options);
    }
    return this.inner.put(payload, options);
  }

  /**
   * Lets the hung `put` calls go on to the inner store, with what is left of their payloads;
   * resolves once the inner store settled them.
   */
  async releasePuts(): Promise<void> {
    const hung = this.hungPuts.splice(0);
    for (const { release } of hung) release();
    await Promise.all(hung.map(({ settled }) => settled));
  }

  async get(ref: string): Promise<Readable> {
    this.calls.get++;
    if (this.failGets > 0) {
      this.failGets--;
      throw new Error('payload store unreachable (get, injected by the test)');
    }
    if (this.hangGets > 0) {
      this.hangGets--;
      return new Promise<Readable>(() => undefined);
    }
    this.failRead('get');
    if (this.stallStreams > 0) {
      this.stallStreams--;
      return this.stallingCopy(await this.inner.get(ref));
    }
    return this.inner.get(ref);
  }

  async head(ref: string): Promise<PayloadInfo | undefined> {
    this.calls.head++;
    if (this.hangHeads > 0) {
      this.hangHeads--;
      return new Promise<PayloadInfo | undefined>(() => undefined);
    }
    this.failRead('head');
    return this.inner.head(ref);
  }

  delete(ref: string): Promise<boolean> {
    return this.deleting('delete', () => this.inner.delete(ref));
  }

  /** The inner store's (or its fallback), with the faults of `delete`. */
  deleteUnpublished(ref: string): Promise<boolean> {
    return this.deleting('deleteUnpublished', () => deleteIfUnpublished(this.inner, ref));
  }

  /** Either delete, counted and failed or hung as `failDeletes` and `hangDeletes` say. */
  private async deleting(what: string, run: () => Promise<boolean>): Promise<boolean> {
    this.calls.delete++;
    if (this.failDeletes > 0) {
      this.failDeletes--;
      throw new Error(`payload store unreachable (${what}, injected by the test)`);
    }
    if (this.hangDeletes > 0) {
      this.hangDeletes--;
      return new Promise<boolean>(() => undefined);
    }
    return run();
  }

  async markPublished(ref: string): Promise<boolean> {
    if (this.hangMarks > 0) {
      this.hangMarks--;
      return new Promise<boolean>(() => undefined);
    }
    if (this.failMarks > 0) {
      this.failMarks--;
      throw new Error('payload store unreachable (markPublished, injected by the test)');
    }
    return this.inner.markPublished(ref);
  }

  async sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    if (this.hangSweeps) {
      return new Promise((resolve) => this.hungSweeps.push(() => resolve([])));
    }
    if (this.failSweeps > 0) {
      this.failSweeps--;
      throw new Error('payload store unreachable (sweepCandidates, injected by the test)');
    }
    return this.inner.sweepCandidates(query);
  }

  /** Settles the hung `sweepCandidates` calls (with no candidates) and stops hanging new ones. */
  releaseSweeps(): void {
    this.hangSweeps = false;
    for (const release of this.hungSweeps.splice(0)) release();
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  /** A stream of `source`'s first chunk that then waits for ever: nothing ends or fails it. */
  private async stallingCopy(source: Readable): Promise<Readable> {
    const chunks = source[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    const first = await chunks.next();
    await chunks.return?.();
    const stalled = new Readable({ read: () => undefined });
    if (!first.done) stalled.push(first.value);
    this.stalled.push(stalled);
    return stalled;
  }

  private failRead(operation: string): void {
    if (this.failReads > 0) {
      this.failReads--;
      throw new Error(`payload store unreachable (${operation}, injected by the test)`);
    }
  }
}

/** Reads exactly `bytes` of `source` (never asking for its end), then waits for ever. */
async function readThenStall(source: Readable, bytes: number): Promise<never> {
  for (let read = 0; read < bytes;) {
    const wanted = Math.min(source.readableLength, bytes - read);
    const chunk = wanted > 0 ? (source.read(wanted) as Buffer | null) : null;
    if (chunk) read += chunk.length;
    else await new Promise((resolve) => source.once('readable', resolve));
  }
  return new Promise<never>(() => undefined);
}
