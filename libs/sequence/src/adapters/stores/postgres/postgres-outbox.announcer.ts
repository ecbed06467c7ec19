import type { Pool } from 'pg';
import type { BoxName } from '../../../ports/outbox-store.port';
import { checkOut } from './postgres-client';
import { NOTIFY_BOXES } from './postgres-outbox.listener';
import { runPipeline } from './postgres-pipeline';

/** How long commits' announcements to other processes are gathered into one NOTIFY. */
const NOTIFY_DEBOUNCE_MS = 5;

/**
 * Announces commits of the store's own transactions that appended to boxes: this process's
 * watchers at once, the other processes' through one NOTIFY per box, sent at most every
 * NOTIFY_DEBOUNCE_MS as a statement of its own. (A NOTIFY inside every business transaction
 * would make PostgreSQL serialize their commits: measured at about a third of the plain commit
 * rate with 16 writers.) The NOTIFY goes on the store's LISTEN connection while it is up, which
 * takes no connection from the application and hears back its own announcements for what they
 * are; otherwise on a pool connection. A caller's own transaction, whose commit the store does
 * not see, carries its NOTIFY instead (append.sql).
 */
export class PostgresOutboxAnnouncer {
  private readonly pending = new Set<BoxName>();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly pool: Pool,
    private readonly channel: string,
    private readonly wakeLocal: (box: BoxName) => void,
    /** Sends the NOTIFY on the LISTEN connection; false when there is none up. */
    private readonly viaListener: (boxes: readonly BoxName[]) => Promise<boolean> = () =>
      Promise.resolve(false),
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
    // A hint: the other processes poll as well.
    const sent = await this.viaListener(boxes).catch(() => false);
    if (!sent) await this.notify(boxes).catch(() => undefined);
  }

  /**
   * One short transaction whose commit sends the NOTIFY, in one round trip. A NOTIFY gives its
   * transaction an id and a commit record; waiting for that record to reach the disk (a flush per
   * announcement, up to 200 a second) would buy nothing: a hint lost in a crash is made up for by
   * polling, and the commits it announces are on disk already.
   */
  private async notify(boxes: readonly BoxName[]): Promise<void> {
    let broken: Error | undefined;
    const onError = (error: Error): void => {
      broken ??= error;
    };
    // Listening from the hand-over on: a server going down mid-call must not be an unheard
    // 'error' event (see checkOut).
    const client = await checkOut(this.pool, onError);
    try {
      await runPipeline(client, [
        { text: 'BEGIN' },
        { text: 'SET LOCAL synchronous_commit TO off' },
        { text: NOTIFY_BOXES, values: [this.channel, boxes] },
        { text: 'COMMIT' },
      ]);
    } catch (error) {
      broken = error as Error;
      throw error;
    } finally {
      // The next holder listens for itself: a listener left behind would pile up on the client.
      client.removeListener('error', onError);
      // Not put back inside a transaction that failed halfway.
      client.release(broken);
    }
  }
}
