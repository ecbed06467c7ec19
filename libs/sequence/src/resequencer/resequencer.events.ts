import type { SequenceEvents } from '../kernel/lifecycle-events';
import type {
  AcceptOutcome,
  GapResolution,
  OpenGap,
  SkippedGap,
} from '../ports/resequencer-store.port';

/** A `resolveGap` that did something. */
type ResolvedGap = Exclude<GapResolution, { kind: 'none' }>;

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
   * After the sweep resolved the listed `gap` (`resolution`: what the store did) on its clock
   * reading `now`. A skip is reported as the store made it: the key may have changed since it was
   * listed (an event buffered below the listed lowest gives up fewer sequences).
   */
  resolved(gap: OpenGap, resolution: ResolvedGap, why: string, now: number) {
    if (resolution.policy !== 'alert') this.openedAt.delete(gap.key);
    if (!this.events.listening || resolution.policy === 'alert') return;
    if (resolution.policy === 'skip') {
      const { skipped } = resolution;
      this.skipped(gap.key, skipped, now, `${skipped.from} missing ${why}`);
      return;
    }
    const common = this.common(gap.key);
    this.events.emit(() => ({
      type: 'gap.dead-lettered',
      ...common,
      expected: gap.expected,
      events: resolution.appended,
      waitedMs: Math.max(0, now - gap.gapSince),
      reason: `${gap.expected} missing ${why}`,
    }));
  }

  /**
   * After an operator skipped the gap of `key` (`ResequencerService`/admin `skip`, `release`) on
   * the clock reading `now`; `skipped`: what the store gave up.
   */
  skippedByOperator(key: string, skipped: SkippedGap, now: number): void {
    this.openedAt.delete(key);
    if (!this.events.listeningTo('gap.skipped')) return;
    this.skipped(key, skipped, now, `${skipped.from} skipped by an operator`);
  }

  private skipped(key: string, skipped: SkippedGap, now: number, reason: string): void {
    const common = this.common(key);
    this.events.emit(() => ({
      type: 'gap.skipped',
      ...common,
      from: skipped.from,
      to: skipped.to,
      waitedMs: Math.max(0, now - skipped.gapSince),
      reason,
    }));
  }

  /** The fields every gap resolution's event has, `at` now. */
  private common(key: string) {
    return { at: Date.now(), channel: this.channel, resequencer: this.resequencer, key };
  }

  private remember(key: string): void {
    if (this.openedAt.size >= REMEMBERED_GAPS) {
      this.openedAt.delete(this.openedAt.keys().next().value as string);
    }
    this.openedAt.set(key, Date.now());
  }
}
