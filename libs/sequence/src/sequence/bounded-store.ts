import { Readable } from 'node:stream';
import { withTimeout } from '../core/async';
import { SequenceStoreTimeoutError } from '../core/errors/sequence-store-timeout.error';
import { sourceChunks, type StallBound } from '../core/source-chunks';
import type { SequenceRef, SequenceStore } from '../ports/sequence-store.port';

/**
 * `store` with each step given up on after `ms` (`tuning.storeTimeoutMs`): a store that stops
 * answering (a frozen server, a network black hole, where nothing is refused and only a timeout
 * notices) then fails the step with a {@link SequenceStoreTimeoutError}, as an unreachable store
 * fails it, instead of holding a fragment message, its prefetch slot or a delivery for ever.
 * `read` fails its stream when the store does not give the next chunk within `ms` (the reader's
 * own time between chunks does not count). `close` is not bounded here: the module's shutdown
 * bounds it.
 */
export function boundedSequenceStore(store: SequenceStore, ms: number): SequenceStore {
  const within = <T>(call: string, subject: string, step: () => Promise<T>): Promise<T> =>
    // In an async function: a store (of yours) that throws before it returns a promise fails the
    // step as a rejection does, rather than throwing into a lease's timer.
    storeStepWithin(store.name, call, subject, ms, (async () => step())());
  const of = refSubject;
  const { listOpen, status, inspect } = store;
  return {
    name: store.name,
    verifiesReads: store.verifiesReads,
    encrypts: store.encrypts,
    accept: (fragment, context) =>
      within('accept', of(fragment), () => store.accept(fragment, context)),
    renewLease: (ref, consumerId, leaseMs, now) =>
      within('renewLease', of(ref), () => store.renewLease(ref, consumerId, leaseMs, now)),
    releaseLease: (ref, consumerId, now) =>
      within('releaseLease', of(ref), () => store.releaseLease(ref, consumerId, now)),
    read: (ref) => {
      const stall: StallBound = {
        ms,
        error: () => new SequenceStoreTimeoutError(store.name, 'read', of(ref), ms),
      };
      // What fails the read reaches its reader as the stream's error.
      return Readable.from(
        sourceChunks(
          () => store.read(ref),
          () => undefined,
          stall,
        ),
        { objectMode: false, highWaterMark: 1 },
      );
    },
    finish: (ref, outcome, context) =>
      within('finish', of(ref), () => store.finish(ref, outcome, context)),
    listExpired: (now, limit) =>
      within('listExpired', store.name, () => store.listExpired(now, limit)),
    expire: (ref, now, retentionMs) =>
      within('expire', of(ref), () => store.expire(ref, now, retentionMs)),
    stats: (now) => within('stats', store.name, () => store.stats(now)),
    // The optional steps only where the store has them: their absence means something.
    ...(listOpen && {
      listOpen: (query) =>
        within('listOpen', query.scope ?? store.name, () => listOpen.call(store, query)),
    }),
    ...(status && {
      status: (ref, now) => within('status', of(ref), () => status.call(store, ref, now)),
    }),
    ...(inspect && {
      inspect: (ref, now) => within('inspect', of(ref), () => inspect.call(store, ref, now)),
    }),
    ping: () => within('ping', store.name, () => store.ping()),
    close: () => store.close(),
  };
}

/** `step` of the store `storeName`, failed with a {@link SequenceStoreTimeoutError} after `ms`. */
export function storeStepWithin<T>(
  storeName: string,
  call: string,
  subject: string,
  ms: number,
  step: Promise<T>,
): Promise<T> {
  return withTimeout(step, ms, () => new SequenceStoreTimeoutError(storeName, call, subject, ms));
}

/** How a store-step timeout names a sequence. */
export function refSubject(ref: SequenceRef): string {
  return `${ref.scope}/${ref.sequenceId}`;
}
