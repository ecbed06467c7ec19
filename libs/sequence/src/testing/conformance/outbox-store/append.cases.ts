import { BOX_NAMES, type NewBoxRecord } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  idsOf,
  record,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/** `append`: what it adds, what it keeps, and the boxes apart. */
export function describeAppendCases(c: OutboxSuiteContext): void {
  describe('append', () => {
    it('returns the ids it added', async () => {
      const added = await appendCommitted(c.store, BOX, [record('a'), record('b'), record('c')]);
      expect(added.sort()).toEqual(['a', 'b', 'c']);
    });

    it('does not add an id the box holds already, from a later transaction, keeping the first', async () => {
      await appendCommitted(c.store, BOX, [record('a', { body: '{"version":1}' }), record('b')]);
      await expect(
        appendCommitted(c.store, BOX, [record('b', { body: '{"version":2}' }), record('c')]),
      ).resolves.toEqual(['c']);
      await expect(
        appendCommitted(c.store, BOX, [record('a', { body: '{"version":2}' })]),
      ).resolves.toEqual([]);

      await expect(c.store.get(BOX, 'a')).resolves.toMatchObject({ body: '{"version":1}' });
      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 }).then((ids) => ids.sort()),
      ).resolves.toEqual(['a', 'b', 'c']);
    });

    it('does not add an id appended earlier in the same transaction, keeping the first', async () => {
      const [first, second] = await c.store.transaction(async (tx) => [
        await c.store.append(BOX, [record('a', { body: '{"version":1}' })], tx),
        await c.store.append(BOX, [record('a', { body: '{"version":2}' })], tx),
      ]);
      expect(first).toEqual(['a']);
      expect(second).toEqual([]);
      await expect(c.store.get(BOX, 'a')).resolves.toMatchObject({ body: '{"version":1}' });
    });

    it('adds an id given twice in one call once, keeping the first', async () => {
      const added = await appendCommitted(c.store, BOX, [
        record('a', { body: '{"version":1}' }),
        record('a', { body: '{"version":2}' }),
      ]);
      expect(added).toEqual(['a']);
      await expect(c.store.get(BOX, 'a')).resolves.toMatchObject({ body: '{"version":1}' });
    });

    it('stores records PENDING, never attempted, due at once even for a claim whose now is 0', async () => {
      await appendCommitted(c.store, BOX, [record('a')]);
      await expect(c.store.get(BOX, 'a')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
        lastError: null,
        completedAt: null,
      });
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: 0 })).resolves.toEqual(['a']);
    });

    it("stamps createdAt with the appending process's clock, in milliseconds", async () => {
      const before = Date.now();
      await appendCommitted(c.store, BOX, [record('a')]);
      const after = Date.now();
      const stored = await c.store.get(BOX, 'a');
      expect(Number.isInteger(stored!.createdAt)).toBe(true);
      expect(stored!.createdAt).toBeGreaterThanOrEqual(before - 1_000);
      expect(stored!.createdAt).toBeLessThanOrEqual(after + 1_000);
    });

    it('keeps kind, type, partition key, headers and body as appended', async () => {
      const command: NewBoxRecord = {
        id: 'cmd-1',
        kind: 'command',
        type: 'ArchiveTask',
        partitionKey: 'Task:42',
        body: '{"taskId":42}',
        headers: { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' },
      };
      const event = record('evt-1', { partitionKey: null, headers: {} });
      await appendCommitted(c.store, BOX, [command, event]);

      await expect(c.store.get(BOX, 'cmd-1')).resolves.toEqual(expect.objectContaining(command));
      await expect(c.store.get(BOX, 'evt-1')).resolves.toEqual(expect.objectContaining(event));
    });

    it('round-trips unicode body and headers byte for byte', async () => {
      const body = JSON.stringify({ text: 'zürich → 東京 🚚 שלום e\u0301', quote: '"\\\'' });
      const headers = {
        'x-city': 'São Paulo 🌎',
        'x-empty': '',
        'x-json': '{"nested":[1,2]}',
        'x-spaces': '  padded  ',
      };
      await appendCommitted(c.store, BOX, [record('unicode', { body, headers })]);

      const stored = await c.store.get(BOX, 'unicode');
      expect(Buffer.from(stored!.body, 'utf8').equals(Buffer.from(body, 'utf8'))).toBe(true);
      expect(stored!.headers).toEqual(headers);
    });

    it('round-trips JSON text exactly as written: spacing, key order, number spelling', async () => {
      // A store that parsed the body (a JSON column) would reorder keys and drop the spacing.
      const body =
        '{ "z": 1,  "a": { "nested": [1, 2.50, 1e3, null, {"deep": {"deeper": true}}] },\n "m": "\\u00e9" }';
      await appendCommitted(c.store, BOX, [record('json', { body })]);
      await expect(c.store.get(BOX, 'json')).resolves.toMatchObject({ body });
    });

    it('round-trips a body of about 1 MB', async () => {
      const body = JSON.stringify({ blob: 'ab€'.repeat(210_000) });
      expect(Buffer.byteLength(body)).toBeGreaterThan(1_000_000);
      await appendCommitted(c.store, BOX, [record('big', { body })]);

      const handed: string[] = [];
      await c.store.claim(BOX, { limit: 1, now: c.t0 }, async (batch) => {
        handed.push(...batch.records.map((each) => each.body));
        return [];
      });
      expect(handed).toHaveLength(1);
      expect(handed[0] === body).toBe(true);
    });

    it('appends nothing for an empty list', async () => {
      await expect(appendCommitted(c.store, BOX, [])).resolves.toEqual([]);
      await expect(c.store.stats(BOX)).resolves.toMatchObject({ pending: 0 });
    });

    it('keeps the boxes apart: one id in two boxes is two records, each claimed from its own box', async () => {
      await appendCommitted(c.store, 'outbox_events', [record('same', { body: '"event"' })]);
      await expect(
        appendCommitted(c.store, 'inbox_commands', [record('same', { body: '"command"' })]),
      ).resolves.toEqual(['same']);

      await expect(c.store.get('outbox_events', 'same')).resolves.toMatchObject({
        body: '"event"',
      });
      await expect(c.store.get('inbox_commands', 'same')).resolves.toMatchObject({
        body: '"command"',
      });
      await expect(c.store.get('outbox_commands', 'same')).resolves.toBeUndefined();
      await expect(
        claimAndComplete(c.store, 'outbox_events', { limit: 10, now: c.t0 }),
      ).resolves.toEqual(['same']);
      await expect(c.store.get('inbox_commands', 'same')).resolves.toMatchObject({
        status: 'PENDING',
      });
    });

    it.each(BOX_NAMES)('appends to and claims from %s', async (box) => {
      await appendCommitted(c.store, box, [record(`${box}-1`), record(`${box}-2`)]);
      const handed: string[] = [];
      await c.store.claim(box, { limit: 10, now: c.t0 }, async (batch) => {
        handed.push(...idsOf(batch));
        return [];
      });
      expect(handed).toEqual([`${box}-1`, `${box}-2`]);
    });
  });
}
