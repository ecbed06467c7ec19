import { Injectable } from '@nestjs/common';
import {
  OutboxService,
  Resequenced,
  ResequencedEvent,
  SequencedHandler,
  SequenceEvents,
  SEQUENCE_TRANSPORT,
  type LifecycleEvent,
  type ReassembledPayload,
  StreamedFragment,
  type Transport,
} from 'nest-sequence';
import { bytes, eventually, makeFragments } from '../support/sequence-test-app';
import { createAdminApp, SwitchGuard, type AdminApp } from './admin-app';
import { BoxesReader } from '../../src/admin/boxes.reader';

const IMAGES = 'admin-actions.images';
const STREAM = 'admin-actions.stream';
const STATUS = 'admin-actions.status';

@Injectable()
class ImagesHandler {
  @SequencedHandler({ channel: IMAGES })
  async handle(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }
}

@Injectable()
class StreamHandler {
  readonly positions: number[] = [];

  @SequencedHandler({ channel: STREAM, mode: 'stream' })
  handle(fragment: StreamedFragment): void {
    this.positions.push(fragment.position);
  }
}

@Injectable()
class StatusHandler {
  readonly delivered: string[] = [];

  /** Awaited before each event is noted delivered. */
  before?: (event: ResequencedEvent) => Promise<void>;

  @Resequenced({ channel: STATUS, gap: { timeoutMs: 3_600_000, policy: 'alert' } })
  async handle(event: ResequencedEvent): Promise<void> {
    await this.before?.(event);
    this.delivered.push(`${event.key}#${event.seq}`);
  }
}

/** The outbox route fails while `failing` is set: its rows turn FAILED at once. */
const routes = { failing: true };

describe('the admin API acting, with a guard and mutations on', () => {
  const guard = new SwitchGuard();
  let admin: AdminApp;
  let transport: Transport;
  const actions: LifecycleEvent[] = [];

  beforeAll(async () => {
    admin = await createAdminApp({
      providers: [ImagesHandler, StatusHandler, StreamHandler],
      admin: { guard, mutations: true, replayRatePerSecond: 1000 },
      sequence: {
        outbox: {
          routes: {
            event: () => {
              if (routes.failing) throw new Error('no route for this event yet');
              return ['admin-actions.orders'];
            },
            command: () => {
              if (routes.failing) throw new Error('no route for this command yet');
              return 'admin-actions.shipping';
            },
          },
        },
      },
    });
    transport = admin.app.get<Transport>(SEQUENCE_TRANSPORT);
    admin.app
      .get(SequenceEvents)
      .of('admin.action')
      .subscribe((event) => actions.push(event));
  });

  afterAll(() => admin.close());

  beforeEach(() => {
    guard.allow = true;
    actions.length = 0;
  });

  it('answers 403 forbidden when the guard refuses', async () => {
    guard.allow = false;
    expect(await admin.get('overview')).toEqual({
      status: 403,
      body: { error: 'forbidden', message: expect.any(String) },
    });
    expect(await admin.post('outbox/retry', { ids: ['a'] })).toMatchObject({ status: 403 });
  });

  it('answers 400 bad-request for a mutation body it cannot use', async () => {
    for (const body of [{}, { ids: [] }, { ids: [42] }, { ids: ['a'], all: true }]) {
      const answer = await admin.post(`dead-letters/${IMAGES}/replay`, body);
      expect({ body, status: answer.status, error: answer.body.error }).toEqual({
        body,
        status: 400,
        error: 'bad-request',
      });
    }
    expect((await admin.post('outbox/retry', { ids: 'a' })).status).toBe(400);
    // A table of the other side, or none the store has.
    for (const channel of ['inbox_events', 'orders', 42]) {
      expect((await admin.post('outbox/retry', { ids: ['a'], channel })).status).toBe(400);
    }
  });

  describe('failed outbox rows', () => {
    async function failedRow(id: string): Promise<void> {
      routes.failing = true;
      await admin.app.get(OutboxService).transaction(async (tx) => {
        tx.publishEvent({
          id,
          type: 'OrderPlaced',
          aggregateType: 'order',
          aggregateId: id,
          payload: {},
        });
      });
      await eventually(
        async () => (await ids('outbox/failed')).includes(id),
        `outbox row ${id} failed`,
      );
    }

    async function ids(route: string): Promise<string[]> {
      const answer = await admin.get<{ items: { id: string }[] }>(route);
      return answer.body.items.map((item) => item.id);
    }

    it('lists a failed row, retries it, and it is published', async () => {
      await failedRow('order-1');
      const listed = await admin.get<{ items: Record<string, unknown>[] }>('outbox/failed');
      expect(listed.body.items).toContainEqual(
        expect.objectContaining({
          id: 'order-1',
          channel: 'outbox_events',
          attempts: 1,
          lastError: expect.stringContaining('no route'),
        }),
      );
      routes.failing = false;

      const answer = await admin.post('outbox/retry', { ids: ['order-1'] });
      expect(answer).toEqual({ status: 200, body: { changed: 1, message: expect.any(String) } });
      await eventually(async () => {
        const found = await admin.get<{ matches: Record<string, unknown>[] }>('find/order-1');
        return found.body.matches.some((m) => m.kind === 'outbox' && m.status === 'COMPLETED');
      }, 'order-1 published');
      expect(await ids('outbox/failed')).not.toContain('order-1');
      expect(actions).toEqual([
        expect.objectContaining({
          type: 'admin.action',
          action: 'outbox.retry',
          targets: ['order-1'],
          changed: 1,
          actor: 'operator-1',
        }),
      ]);
    });

    it('says it changed nothing when retrying a row that is no longer failed', async () => {
      const answer = await admin.post('outbox/retry', { ids: ['order-1', 'never-there'] });
      expect(answer.status).toBe(200);
      expect(answer.body).toEqual({
        changed: 0,
        message: expect.stringMatching(/^nothing changed/),
      });
      expect(actions).toEqual([expect.objectContaining({ action: 'outbox.retry', changed: 0 })]);
    });

    it('discards a failed row once, then says it changed nothing', async () => {
      await failedRow('order-2');
      expect((await admin.post('outbox/discard', { ids: ['order-2'] })).body).toMatchObject({
        changed: 1,
      });
      expect(await ids('outbox/failed')).not.toContain('order-2');
      // Kept, its id still known, until the purge: a copy appended again is a duplicate. Told as
      // what it is: given up on, not published.
      expect((await admin.get<{ matches: unknown[] }>('find/order-2')).body.matches).toEqual([
        expect.objectContaining({
          box: 'outbox_events',
          status: 'DISCARDED',
          summary: expect.stringContaining('DISCARDED'),
          lastError: expect.stringContaining('no route'),
        }),
      ]);
      const again = await admin.post('outbox/discard', { ids: ['order-2'] });
      expect(again.body).toEqual({
        changed: 0,
        message: expect.stringMatching(/^nothing changed/),
      });
    });

    it("acts in the row's table only when the body names it: an event and a command may share an id", async () => {
      routes.failing = true;
      await admin.app.get(OutboxService).transaction(async (tx) => {
        tx.publishEvent({
          id: 'dup-1',
          type: 'OrderPlaced',
          aggregateType: 'order',
          aggregateId: 'o-1',
          payload: {},
        });
        tx.sendCommand({ id: 'dup-1', type: 'ShipOrder', targetService: 'shipping', payload: {} });
      });
      const tables = async () =>
        (await admin.get<{ items: { id: string; channel: string }[] }>('outbox/failed')).body.items
          .filter((item) => item.id === 'dup-1')
          .map((item) => item.channel)
          .sort();
      await eventually(async () => (await tables()).length === 2, 'both dup-1 rows failed');

      const one = await admin.post('outbox/discard', { ids: ['dup-1'], channel: 'outbox_events' });
      expect(one.body).toMatchObject({ changed: 1 });
      expect(await tables()).toEqual(['outbox_commands']);

      const rest = await admin.post('outbox/discard', { ids: ['dup-1'] });
      expect(rest.body).toMatchObject({ changed: 1 });
      expect(await tables()).toEqual([]);
    });

    it('records an action that failed as a whole, with its error', async () => {
      const boxes = admin.app.get(BoxesReader);
      jest.spyOn(boxes, 'retry').mockRejectedValueOnce(new Error('the outbox store is away'));

      expect((await admin.post('outbox/retry', { ids: ['order-9'] })).status).toBe(500);
      expect(actions).toEqual([
        expect.objectContaining({
          action: 'outbox.retry',
          targets: ['order-9'],
          changed: 0,
          error: 'the outbox store is away',
        }),
      ]);
    });

    it('lists no failed inbox rows, and retrying one changes nothing', async () => {
      expect(await ids('inbox/failed')).toEqual([]);
      expect((await admin.post('inbox/retry', { ids: ['x'] })).body).toMatchObject({ changed: 0 });
    });
  });

  describe('resequencer gaps', () => {
    async function send(key: string, seq: number): Promise<void> {
      await transport.publish(STATUS, Buffer.from(`${key}#${seq}`), {
        'x-resequence-key': key,
        'x-resequence-seq': seq,
      });
    }

    it('lists a key waiting on a gap, skips it, then releases what is held behind the next', async () => {
      const handler = admin.app.get(StatusHandler);
      for (const seq of [3, 4, 6]) await send('transfer-1', seq);
      await eventually(async () => {
        const gaps = await admin.get<{ items: { key: string; held: number }[] }>(
          'resequencer/gaps',
        );
        return gaps.body.items.some((gap) => gap.key === 'transfer-1' && gap.held === 3);
      }, 'the gap of transfer-1 listed');
      const gaps = await admin.get<{ items: Record<string, unknown>[] }>('resequencer/gaps');
      expect(gaps.body.items).toContainEqual(
        expect.objectContaining({ resequencer: STATUS, key: 'transfer-1', expected: 1, held: 3 }),
      );
      const found = await admin.get<{ matches: Record<string, unknown>[] }>('find/transfer-1');
      expect(found.body.matches).toContainEqual(
        expect.objectContaining({ kind: 'resequencer-key', resequencer: STATUS, next: 1 }),
      );

      const skip = await admin.post(`resequencer/gaps/${STATUS}/transfer-1/skip`);
      expect(skip.body).toMatchObject({ changed: 1, skippedGaps: 1, released: 2, next: 5 });
      await eventually(() => handler.delivered.length === 2, 'transfer-1 #3 and #4 delivered');
      expect(handler.delivered).toEqual(['transfer-1#3', 'transfer-1#4']);

      const release = await admin.post(`resequencer/gaps/${STATUS}/transfer-1/release`);
      expect(release.body).toMatchObject({ changed: 1, released: 1, next: 7 });
      await eventually(() => handler.delivered.length === 3, 'transfer-1 #6 delivered');

      const again = await admin.post(`resequencer/gaps/${STATUS}/transfer-1/skip`);
      expect(again.body).toMatchObject({
        changed: 0,
        message: expect.stringMatching(/^nothing changed/),
      });
      expect(actions.map((event) => [event.type === 'admin.action' && event.action])).toEqual([
        ['gap.skip'],
        ['gap.release'],
        ['gap.skip'],
      ]);
    });

    it('counts the events a skip released, whatever arrives for the key meanwhile', async () => {
      const handler = admin.app.get(StatusHandler);
      const delivered = handler.delivered.length;
      for (const seq of [3, 4, 6]) await send('transfer-2', seq);
      const held = async (key: string) => {
        const found = await admin.get<{ matches: { buffered?: number[] }[] }>(`find/${key}`);
        return found.body.matches.flatMap((match) => match.buffered ?? []);
      };
      await eventually(async () => (await held('transfer-2')).length === 3, 'three events held');
      // An event for the key that arrives while the skip is under way (before the released
      // events are delivered) is held behind the next gap: the buffer then holds one event
      // fewer than before the skip, where two were released.
      handler.before = async (event) => {
        if (event.key !== 'transfer-2' || event.seq !== 3) return;
        await send('transfer-2', 9);
        await eventually(async () => (await held('transfer-2')).includes(9), '#9 held');
      };
      try {
        const skip = await admin.post(`resequencer/gaps/${STATUS}/transfer-2/skip`);
        expect(skip.body).toMatchObject({ changed: 1, skippedGaps: 1, released: 2, next: 5 });
      } finally {
        handler.before = undefined;
      }
      await eventually(() => handler.delivered.length === delivered + 2, '#3 and #4 delivered');
      const found = await admin.get<{ matches: Record<string, unknown>[] }>('find/transfer-2');
      expect(found.body.matches).toContainEqual(
        expect.objectContaining({ kind: 'resequencer-key', next: 5, buffered: [6, 9] }),
      );
    });
    it('skips only the gap the operator saw: one opened since is left alone', async () => {
      const handler = admin.app.get(StatusHandler);
      const gapOf = async (key: string) => {
        const gaps = await admin.get<{ items: { key: string; expected: number; since: number }[] }>(
          'resequencer/gaps',
        );
        return gaps.body.items.find((gap) => gap.key === key);
      };
      await send('transfer-3', 2);
      await eventually(async () => (await gapOf('transfer-3')) !== undefined, 'the gap listed');
      const seen = (await gapOf('transfer-3'))!;
      expect(seen.expected).toBe(1);
      // Before the operator confirms, the gap fills and the key waits on a new one.
      await send('transfer-3', 1);
      await eventually(
        () => handler.delivered.includes('transfer-3#2'),
        'transfer-3 #1 and #2 delivered',
      );
      await new Promise((resolve) => setTimeout(resolve, 5));
      await send('transfer-3', 4);
      await eventually(async () => (await gapOf('transfer-3'))?.expected === 3, 'the new gap');

      for (const action of ['skip', 'release']) {
        const answer = await admin.post(`resequencer/gaps/${STATUS}/transfer-3/${action}`, {
          since: seen.since,
        });
        expect(answer.body).toMatchObject({
          changed: 0,
          message: expect.stringMatching(/^nothing/),
        });
      }
      await send('transfer-3', 3);
      await eventually(() => handler.delivered.includes('transfer-3#4'), 'transfer-3 #3 and #4');
      expect(handler.delivered.filter((event) => event.startsWith('transfer-3#'))).toEqual([
        'transfer-3#1',
        'transfer-3#2',
        'transfer-3#3',
        'transfer-3#4',
      ]);
    });

    it('refuses a since that is not a time', async () => {
      const answer = await admin.post(`resequencer/gaps/${STATUS}/transfer-4/skip`, {
        since: 'yesterday',
      });
      expect(answer.status).toBe(400);
    });

    it("refuses to skip a stream mode sequence's gap: its handler would see the end of a payload with a hole", async () => {
      const fragments = makeFragments('study-7', bytes(3_000), 1_000);
      await transport.publish(STREAM, fragments[2].body, fragments[2].headers);
      const resequencer = `sequence-stream:${STREAM}`;
      await eventually(async () => {
        const gaps = await admin.get<{ items: { resequencer: string; key: string }[] }>(
          'resequencer/gaps',
        );
        return gaps.body.items.some((gap) => gap.resequencer === resequencer);
      }, 'the stream gap listed');

      for (const action of ['skip', 'release']) {
        const answer = await admin.post(`resequencer/gaps/${resequencer}/study-7/${action}`);
        expect(answer).toMatchObject({
          status: 400,
          body: { error: 'bad-request', message: expect.stringContaining('cannot be skipped') },
        });
      }
      expect(admin.app.get(StreamHandler).positions).toEqual([]);
    });

    it('answers 404 not-found for a resequencer the app does not have', async () => {
      const answer = await admin.post('resequencer/gaps/no-such/key/skip');
      expect(answer).toMatchObject({ status: 404, body: { error: 'not-found' } });
    });
  });

  describe('dead letters', () => {
    it('browses them by reason, replays one once, and discards the rest', async () => {
      const [fragment] = makeFragments('broken-1', bytes(100), 100);
      await transport.publish(
        IMAGES,
        Buffer.from('not the body the crc was computed for'),
        fragment.headers,
      );
      await eventually(async () => {
        const summary = await admin.get<{ channels: { channel: string; total: number }[] }>(
          'dead-letters',
        );
        return summary.body.channels.some((c) => c.channel === IMAGES && c.total === 1);
      }, 'the fragment dead-lettered');
      const summary = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');
      const images = summary.body.channels.find((c) => c.channel === IMAGES)!;
      expect(images).toMatchObject({ deadLetterChannel: `${IMAGES}.dlq`, total: 1 });
      const [{ reason }] = images.byReason as { reason: string; count: number }[];

      const listed = await admin.get<{ items: { id: string; reason: string }[] }>(
        `dead-letters/${IMAGES}?reason=${encodeURIComponent(reason)}`,
      );
      expect(listed.body.items).toHaveLength(1);
      const [{ id }] = listed.body.items;
      const none = await admin.get<{ items: unknown[] }>(
        `dead-letters/${IMAGES}?reason=other-code`,
      );
      expect(none.body.items).toEqual([]);

      const replay = await admin.post(`dead-letters/${IMAGES}/replay`, { ids: [id] });
      expect(replay.body).toMatchObject({ changed: 1, done: [id], missing: [], failed: [] });
      const replayAgain = await admin.post(`dead-letters/${IMAGES}/replay`, { ids: [id] });
      expect(replayAgain.body).toMatchObject({
        changed: 0,
        done: [],
        missing: [id],
        message: expect.stringMatching(/^nothing changed/),
      });

      // The replayed fragment is still corrupt: it comes back, marked as replayed once.
      await eventually(async () => {
        const items = await admin.get<{ items: { replays: number }[] }>(`dead-letters/${IMAGES}`);
        return items.body.items.some((item) => item.replays === 1);
      }, 'the replayed fragment dead-lettered again');
      const discard = await admin.post(`dead-letters/${IMAGES}/discard`, { all: true });
      expect(discard.body).toMatchObject({ changed: 1 });
      const discardAgain = await admin.post(`dead-letters/${IMAGES}/discard`, { reason });
      expect(discardAgain.body).toMatchObject({
        changed: 0,
        message: expect.stringMatching(/^nothing changed/),
      });
      expect(actions.map((event) => event.type === 'admin.action' && event.action)).toEqual([
        'dead-letter.replay',
        'dead-letter.replay',
        'dead-letter.discard',
        'dead-letter.discard',
      ]);
    });
  });
});
