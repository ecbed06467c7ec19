import type { BoxName } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  eventually,
  record,
  sleep,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/**
 * `watch`: wake-ups after commits. A wake-up may be lost or repeated (relays poll as well), so
 * the cases only ask that one comes after a commit, and none for a rollback.
 */
export function describeWatchCases(c: OutboxSuiteContext): void {
  describe('watch', () => {
    let unsubscribes: (() => Promise<void>)[] = [];

    afterEach(async () => {
      for (const unsubscribe of unsubscribes) await unsubscribe();
      unsubscribes = [];
    });

    /** Subscribes a listener that records the boxes it is called with. */
    async function watchBoxes(): Promise<{ boxes: BoxName[]; unsubscribe(): Promise<void> }> {
      const boxes: BoxName[] = [];
      const stop = await c.store.watch((box) => boxes.push(box));
      unsubscribes.push(stop);
      const unsubscribe = async () => {
        // Once only: the port does not say that unsubscribing twice is harmless.
        unsubscribes = unsubscribes.filter((each) => each !== stop);
        await stop();
      };
      return { boxes, unsubscribe };
    }

    it('calls the listener with the box soon after a transaction that appended to it commits', async () => {
      const { boxes } = await watchBoxes();
      await appendCommitted(c.store, 'outbox_commands', [record('cmd-1', { kind: 'command' })]);
      await eventually(() => boxes.includes('outbox_commands'), 'a wake-up for outbox_commands');
    });

    it('calls the listener after a receive adds a record', async () => {
      const { boxes } = await watchBoxes();
      await c.store.receive('inbox_events', record('msg-1'));
      await eventually(() => boxes.includes('inbox_events'), 'a wake-up for inbox_events');
    });

    it('does not call the listener for a transaction that rolled back', async () => {
      const { boxes } = await watchBoxes();
      await expect(
        c.store.transaction(async (tx) => {
          await c.store.append('outbox_events', [record('rolled-back')], tx);
          throw new Error('rolled back');
        }),
      ).rejects.toThrow('rolled back');
      // A commit to another box afterwards: once its wake-up is in, the rollback's would be too.
      await appendCommitted(c.store, 'outbox_commands', [record('cmd-1', { kind: 'command' })]);
      await eventually(() => boxes.includes('outbox_commands'), 'a wake-up for outbox_commands');
      await sleep(300);
      expect(boxes).not.toContain('outbox_events');
    });

    for (const change of ['retry', 'discard'] as const) {
      it(`calls the listener after a ${change} changed a FAILED record`, async () => {
        const discard = c.store.discard?.bind(c.store);
        if (change === 'discard' && !discard) {
          throw new Error(`${c.store.name} does not implement discard`);
        }
        const { boxes } = await watchBoxes();
        await appendCommitted(c.store, BOX, [record('poison')]);
        await c.store.claim(BOX, { limit: 10, now: c.t0 }, async (batch) =>
          batch.records.map((each) => ({ id: each.id, status: 'failed', error: 'poison' })),
        );
        await eventually(() => boxes.includes(BOX), 'the wake-up of the append');
        // Past the append's wake-ups, late or repeated ones included.
        await sleep(300);
        boxes.length = 0;

        const changed =
          change === 'retry'
            ? await c.store.retry(BOX, ['poison'], c.t0)
            : await discard!(BOX, ['poison']);
        expect(changed).toBe(1);
        await eventually(() => boxes.includes(BOX), `a wake-up after the ${change}`);
      });
    }

    it('stops calling a listener once it unsubscribed, other listeners going on', async () => {
      const gone = await watchBoxes();
      const staying = await watchBoxes();
      await gone.unsubscribe();

      await appendCommitted(c.store, 'outbox_events', [record('evt-1')]);
      await eventually(() => staying.boxes.includes('outbox_events'), 'the remaining listener');
      expect(gone.boxes).toEqual([]);
    });
  });
}
