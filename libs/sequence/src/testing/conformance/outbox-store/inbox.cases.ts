import type { RecordOutcome } from '../../../ports/outbox-store.port';
import {
  claimAndComplete,
  claimWith,
  record,
  type OutboxSuiteContext,
} from './outbox-suite.context';

const INBOX = 'inbox_events';

/** `receive`: the inbox's insert-if-absent. */
export function describeInboxCases(c: OutboxSuiteContext): void {
  describe('receive', () => {
    it('adds a record it has not seen, PENDING and claimable, as received', async () => {
      const received = record('msg-1', {
        partitionKey: 'Order:1',
        headers: { 'x-origin': 'billing' },
      });
      await expect(c.store.receive(INBOX, received)).resolves.toBe('added');
      await expect(c.store.get(INBOX, 'msg-1')).resolves.toEqual(
        expect.objectContaining({ ...received, status: 'PENDING', attempts: 0 }),
      );
      await expect(claimAndComplete(c.store, INBOX, { limit: 10, now: 0 })).resolves.toEqual([
        'msg-1',
      ]);
    });

    it('answers duplicate for an id it holds, keeping the first copy', async () => {
      await c.store.receive(INBOX, record('msg-1', { body: '"first"' }));
      await expect(c.store.receive(INBOX, record('msg-1', { body: '"second"' }))).resolves.toBe(
        'duplicate',
      );
      await expect(c.store.get(INBOX, 'msg-1')).resolves.toMatchObject({ body: '"first"' });
      await expect(c.store.stats(INBOX)).resolves.toMatchObject({ pending: 1 });
    });

    it.each<[string, RecordOutcome['status']]>([
      ['COMPLETED', 'completed'],
      ['FAILED', 'failed'],
      ['PENDING after a retry', 'retry'],
    ])(
      'answers duplicate for an id whose record is %s, leaving it so',
      async (_status, outcome) => {
        await c.store.receive(INBOX, record('msg-1'));
        await claimWith(c.store, INBOX, { limit: 10, now: c.t0 }, (each) =>
          outcome === 'retry'
            ? { id: each.id, status: outcome, nextAttemptAt: c.t0 + 60_000, error: 'later' }
            : outcome === 'failed'
              ? { id: each.id, status: outcome, error: 'poison' }
              : { id: each.id, status: 'completed' },
        );
        const before = await c.store.get(INBOX, 'msg-1');

        await expect(c.store.receive(INBOX, record('msg-1'))).resolves.toBe('duplicate');
        await expect(c.store.get(INBOX, 'msg-1')).resolves.toEqual(before);
      },
    );

    it('answers duplicate for the id of a FAILED record an operator discarded', async () => {
      const discard = c.store.discard?.bind(c.store);
      if (!discard) throw new Error(`${c.store.name} does not implement discard`);
      await c.store.receive(INBOX, record('msg-1'));
      await claimWith(c.store, INBOX, { limit: 10, now: c.t0 }, (each) => ({
        id: each.id,
        status: 'failed',
        error: 'poison',
      }));
      await expect(discard(INBOX, ['msg-1'])).resolves.toBe(1);

      await expect(c.store.receive(INBOX, record('msg-1'))).resolves.toBe('duplicate');
      await expect(claimAndComplete(c.store, INBOX, { limit: 10, now: c.t0 })).resolves.toEqual([]);
    });

    it('keeps received records apart from the same ids in another box', async () => {
      await c.store.receive('inbox_events', record('msg-1'));
      await expect(c.store.receive('inbox_commands', record('msg-1'))).resolves.toBe('added');
    });

    it('hands received records out in the order received', async () => {
      for (const id of ['msg-3', 'msg-1', 'msg-2']) await c.store.receive(INBOX, record(id));
      await expect(claimAndComplete(c.store, INBOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'msg-3',
        'msg-1',
        'msg-2',
      ]);
    });
  });
}
