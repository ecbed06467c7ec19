import type { ResequencerLifecycleEvent, SequenceEvents } from '../kernel/lifecycle-events';
import type { AcceptOutcome, OpenGap, ResequencerKeyState } from '../ports/resequencer-store.port';
import type { GapPolicy } from '../ports/resequencer-store.port';

/** Gaps whose opening time one resequencer remembers at once (for `gap.closed`'s `waitedMs`). */
const REMEMBERED_GAPS = 4096;

/**
 * One resequencer's gap events, one method per emission point: each returns at once when nothing
 * listens. The store decides each outcome in one atomic step, so each event is emitted once per
 * cluster, by the instance whose call made it.
 */
export class ResequencerLifecycle {
  private readonly openedAt = new Map<string, number>();

  constructor(
    private readonly events: SequenceEvents,
    private readonly resequencer: string,
    private readonly channel: string,
  ) {}

  /** After `accept` took event `seq` of `key`. */
  accepted(key: string, seq: number, outcome: AcceptOutcome): void {
    if (!this.events.listening) return;
    if (outcome.kind === 'buffered' && outcome.buffered === 1) {
      this.remember(key);
      this.events.emit(() => ({
        type: 'gap.opened',
        at: Date.now(),
        channel: this.channel,
        resequencer: this.resequencer,
        key,
        expected: outcome.next,
        seq,
        held: outcome.buffered,
      }));
    } else if (outcome.kind === 'released' && outcome.count > 1) {
      const at = Date.now();
      const openedAt = this.openedAt.get(key);
      this.openedAt.delete(key);
      this.events.emit(() => ({
        type: 'gap.closed',
        at,
        channel: this.channel,
        resequencer: this.resequencer,
        key,
        expected: seq,
        released: outcome.count,
        ...(openedAt !== undefined ? { waitedMs: Math.max(0, at - openedAt) } : {}),
      }));
    }
  }

  /**
   * After the sweep resolved `gap` with `policy` (`appended`: hand-off items it queued) on its
   * clock reading `now`.
   */
  resolved(gap: OpenGap, policy: GapPolicy, appended: number, why: string, now: number) {
    if (policy !== 'alert') this.openedAt.delete(gap.key);
    if (!this.events.listening || policy === 'alert') return;
    const at = Date.now();
    const waitedMs = Math.max(0, now - gap.gapSince);
    const reason = `${gap.expected} missing ${why}`;
    const common = { at, channel: this.channel, resequencer: this.resequencer, key: gap.key };
    if (policy === 'skip') {
      this.events.emit(() => ({
        type: 'gap.skipped',
        ...common,
        from: gap.expected,
        to: gap.lowest - 1,
        waitedMs,
        reason,
      }));
    } else {
      this.events.emit(() => ({
        type: 'gap.dead-lettered',
        ...common,
        expected: gap.expected,
        events: appended,
        waitedMs,
        reason,
      }));
    }
  }

  /** True when a listener may want events of `type` (the caller skips reads made only for it). */
  wants(type: ResequencerLifecycleEvent['type']): boolean {
    return this.events.listeningTo(type);
  }

  /**
   * After an operator skipped the gap of `key` (`ResequencerService`/admin `skip`, `release`) on
   * the clock reading `now`; `before`: the key's state read just before, when an event was wanted.
   */
  skippedByOperator(key: string, before: ResequencerKeyState | undefined, now: number): void {
    this.openedAt.delete(key);
    if (!this.events.listeningTo('gap.skipped') || !before || before.buffered.length === 0) return;
    const lowest = before.buffered[0];
    const gapSince = before.gapSince;
    this.events.emit(() => ({
      type: 'gap.skipped',
      at: Date.now(),
      channel: this.channel,
      resequencer: this.resequencer,
      key,
      from: before.next,
      to: lowest - 1,
      waitedMs: gapSince !== undefined ? Math.max(0, now - gapSince) : 0,
      reason: `${before.next} skipped by an operator`,
    }));
  }

  private remember(key: string): void {
    if (this.openedAt.size >= REMEMBERED_GAPS) {
      this.openedAt.delete(this.openedAt.keys().next().value as string);
    }
    this.openedAt.set(key, Date.now());
  }
}
