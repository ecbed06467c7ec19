import type { SequenceEvents } from '../kernel/lifecycle-events';
import type { BoxName, RecordOutcome, StoredRecord } from '../ports/outbox-store.port';

/**
 * One outbox or inbox box's lifecycle events, one method per emission point: each returns at
 * once when nothing listens. A box's rows are claimed by one instance at a time and settled once,
 * so each event is emitted once per cluster (a crash between the work and its settle repeats it).
 */
export class BoxLifecycle {
  constructor(
    private readonly events: SequenceEvents,
    private readonly box: BoxName,
  ) {}

  get listening(): boolean {
    return this.events.listening;
  }

  /** The relay's broker confirmed `record` on every channel it routes to. */
  published(record: StoredRecord, channels: readonly string[]): void {
    if (!this.events.listeningTo('outbox.published')) return;
    const at = Date.now();
    this.events.emit(() => ({
      type: 'outbox.published',
      at,
      channel: channels[0] ?? '',
      ...rowOf(record),
      channels: [...channels],
      lagMs: Math.max(0, at - record.createdAt),
    }));
  }

  /** An `@InboxHandler` handled `record` and its claim commits with it. */
  handled(record: StoredRecord, channel: string): void {
    if (!this.events.listeningTo('inbox.handled')) return;
    const at = Date.now();
    this.events.emit(() => ({
      type: 'inbox.handled',
      at,
      channel,
      ...rowOf(record),
      lagMs: Math.max(0, at - record.createdAt),
    }));
  }

  /** The inbox already had a message with this id: dropped. */
  duplicate(channel: string, record: Pick<StoredRecord, 'id' | 'kind' | 'type'>): void {
    if (!this.events.listeningTo('inbox.duplicate')) return;
    this.events.emit(() => ({
      type: 'inbox.duplicate',
      at: Date.now(),
      channel,
      id: record.id,
      kind: record.kind,
      messageType: record.type,
    }));
  }

  /** An attempt on `record` failed: `outcome` says whether it is retried or `FAILED`. */
  attemptFailed(record: StoredRecord, outcome: RecordOutcome, channel: () => string): void {
    if (!this.events.listening) return;
    if (outcome.status !== 'retry' && outcome.status !== 'failed') return;
    const inbox = this.box.startsWith('inbox');
    const at = Date.now();
    const common = { at, channel: channel(), ...rowOf(record), reason: outcome.error };
    if (outcome.status === 'retry') {
      const { nextAttemptAt } = outcome;
      this.events.emit(() =>
        inbox
          ? { type: 'inbox.retried', ...common, nextAttemptAt }
          : { type: 'outbox.retried', ...common, nextAttemptAt },
      );
    } else {
      this.events.emit(() =>
        inbox ? { type: 'inbox.failed', ...common } : { type: 'outbox.failed', ...common },
      );
    }
  }
}

function rowOf(record: StoredRecord) {
  return {
    id: record.id,
    kind: record.kind,
    messageType: record.type,
    attempts: record.attempts + 1,
  };
}
