import type { Pool } from 'pg';
import type { BoxName } from '../../../ports/outbox-store.port';

/** How long commits' announcements to other processes are gathered into one NOTIFY. */
const NOTIFY_DEBOUNCE_MS = 5;

/**
 * Announces commits of the store's own transactions that appended to boxes: this process's
 * watchers at once, the other processes' through one NOTIFY per box, sent at most every
 * NOTIFY_DEBOUNCE_MS as a statement of its own. (A NOTIFY inside every business transaction
 * would make PostgreSQL serialize their commits: measured at about a third of the plain commit
 * rate with 16 writers.) A caller's own transaction, whose commit the store does not see, carries
 * its NOTIFY instead (append.sql).
 */
export class PostgresOutboxAnnouncer {
  private readonly pending = new Set<BoxName>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly pool: Pool,
    private readonly channel: string,
    private readonly wakeLocal: (box: BoxName) => void,
  ) {}

  announce(boxes: Iterable<BoxName>): void {
    let any = false;
    for (const box of boxes) {
      any = true;
      this.wakeLocal(box);
      this.pending.add(box);
    }
    if (any) this.timer ??= setTimeout(() => void this.flush(), NOTIFY_DEBOUNCE_MS);
  }

  /** Sends what is gathered now (also before the pool ends). */
  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    const boxes = [...this.pending];
    this.pending.clear();
    if (boxes.length === 0 || this.pool.ending) return;
    await this.pool
      .query('SELECT pg_notify($1, box) FROM unnest($2::text[]) AS box', [this.channel, boxes])
      .catch(() => undefined); // a hint: the other processes poll as well
  }
}
