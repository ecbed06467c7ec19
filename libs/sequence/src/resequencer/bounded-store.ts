import { withTimeout } from '../core/async';
import { ResequencerStoreTimeoutError } from '../core/errors/resequencer-store-timeout.error';
import type { ResequencerKey, ResequencerStore } from '../ports/resequencer-store.port';

/**
 * `store` with each step given up on after `ms` (`tuning.storeTimeoutMs`): a store that stops
 * answering (a frozen server, a network black hole, where nothing is refused and only a timeout
 * notices) then fails the step with a {@link ResequencerStoreTimeoutError}, as an unreachable
 * store fails it, instead of holding an input message, its prefetch slot and its key's drain for
 * ever. `close` is not bounded here: the module's shutdown bounds it.
 */
export function boundedResequencerStore(store: ResequencerStore, ms: number): ResequencerStore {
  const within = <T>(call: string, subject: string, step: () => Promise<T>): Promise<T> =>
    // In an async function: a store (of yours) that throws before it returns a promise fails the
    // step as a rejection does, rather than throwing into a drain lease's timer.
    withTimeout(
      (async () => step())(),
      ms,
      () => new ResequencerStoreTimeoutError(store.name, call, subject, ms),
    );
  const of = (key: ResequencerKey) => `${key.scope}/${key.key}`;
  return {
    name: store.name,
    accept: (key, entry, context) =>
      within('accept', of(key), () => store.accept(key, entry, context)),
    claimDrain: (key, context) =>
      within('claimDrain', of(key), () => store.claimDrain(key, context)),
    settleDrain: (key, count, context) =>
      within('settleDrain', of(key), () => store.settleDrain(key, count, context)),
    renewDrain: (key, holder, leaseMs, now) =>
      within('renewDrain', of(key), () => store.renewDrain(key, holder, leaseMs, now)),
    releaseDrain: (key, holder) =>
      within('releaseDrain', of(key), () => store.releaseDrain(key, holder)),
    listGaps: (scope, openedBefore, limit, includeAlerted) =>
      within('listGaps', scope, () => store.listGaps(scope, openedBefore, limit, includeAlerted)),
    resolveGap: (key, policy, context) =>
      within('resolveGap', of(key), () => store.resolveGap(key, policy, context)),
    listExpiringGaps: (scope, now, limit) =>
      within('listExpiringGaps', scope, () => store.listExpiringGaps(scope, now, limit)),
    listStalledHandOffs: (scope, idleSince, limit) =>
      within('listStalledHandOffs', scope, () =>
        store.listStalledHandOffs(scope, idleSince, limit),
      ),
    gapStats: (scope, now) => within('gapStats', scope, () => store.gapStats(scope, now)),
    retire: (key, retainMs, now) =>
      within('retire', of(key), () => store.retire(key, retainMs, now)),
    inspect: (key, start) => within('inspect', of(key), () => store.inspect(key, start)),
    bufferedTotal: (scope) => within('bufferedTotal', scope, () => store.bufferedTotal(scope)),
    bufferedBytes: (scope) => within('bufferedBytes', scope, () => store.bufferedBytes(scope)),
    ping: () => within('ping', store.name, () => store.ping()),
    close: () => store.close(),
  };
}
