import { Injectable } from '@nestjs/common';
import {
  InMemoryTransport,
  SequencedHandler,
  SequenceEvents,
  type LifecycleEvent,
  type ReassembledPayload,
} from 'nest-sequence';
import type { DeadLetterActionResult, DeadLetterBox, DeadLetterPage } from 'nest-sequence/ports';
import { ForwardingTransport } from 'nest-sequence/testing';
import { bytes, makeFragments, publishAll } from '../support/sequence-test-app';
import { createAdminApp, type AdminApp } from './admin-app';

const CHANNEL = 'admin-dead-letters.orders';

/**
 * The in-memory transport's dead letters, as a transport whose browse disturbs them (RabbitMQ):
 * every browse is counted, and actions can be made to fail as a whole.
 */
class DisturbingBox implements DeadLetterBox {
  readonly browseIsNonDestructive = false;
  browses = 0;
  failActions = false;

  constructor(private readonly inner: DeadLetterBox) {}

  count(channel: string): Promise<number | undefined> {
    return this.inner.count(channel);
  }

  browse(
    channel: string,
    options: { readonly limit: number; readonly reason?: string },
  ): Promise<DeadLetterPage> {
    this.browses += 1;
    return this.inner.browse(channel, options);
  }

  body(channel: string, id: string): Promise<Buffer | undefined> {
    return this.inner.body(channel, id);
  }

  async replay(
    channel: string,
    ids: readonly string[],
    options: { readonly ratePerSecond: number },
  ): Promise<DeadLetterActionResult> {
    if (this.failActions) throw new Error('the broker connection is gone');
    return this.inner.replay(channel, ids, options);
  }

  discard(channel: string, ids: readonly string[]): Promise<DeadLetterActionResult> {
    return this.inner.discard(channel, ids);
  }
}

class DisturbingTransport extends ForwardingTransport {
  readonly name = 'disturbing';
  readonly box: DisturbingBox;

  constructor(inner: InMemoryTransport) {
    super(inner);
    this.box = new DisturbingBox(inner.deadLetters());
  }

  override deadLetters(): DeadLetterBox {
    return this.box;
  }
}

describe('the admin API over dead letters that a browse disturbs', () => {
  const inner = new InMemoryTransport();
  const transport = new DisturbingTransport(inner);
  const actions: LifecycleEvent[] = [];
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { mutations: true, deadLetterChannels: [CHANNEL] },
      sequence: { transport },
    });
    admin.app
      .get(SequenceEvents)
      .of('admin.action')
      .subscribe((event) => actions.push(event));
    const reasons = ['integrity-mismatch: crc', 'integrity-mismatch: crc', 'expired: old'];
    for (const [index, reason] of reasons.entries()) {
      await inner.publish(inner.deadLetterChannel(CHANNEL), Buffer.from('x'), {
        'x-death-reason': reason,
        'x-message-id': `order-${index}`,
      });
    }
  });

  afterAll(() => admin.close());

  beforeEach(() => {
    transport.box.browses = 0;
    transport.box.failActions = false;
    actions.length = 0;
  });

  it('counts them for the overview and the channel list without reading any', async () => {
    const overview = await admin.get('overview');
    const list = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');

    expect(overview.body).toMatchObject({ deadLetters: { total: 3, channels: 1 } });
    expect(list.body.channels).toEqual([
      { channel: CHANNEL, deadLetterChannel: `${CHANNEL}.dlq`, total: 3 },
    ]);
    expect(transport.box.browses).toBe(0);
  });

  it('groups one channel by reason on request, reading it once within the cache time', async () => {
    const first = await admin.get(`dead-letters/${CHANNEL}/reasons`);
    const again = await admin.get(`dead-letters/${CHANNEL}/reasons`);
    const list = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');

    const byReason = [
      { reason: 'integrity-mismatch', count: 2 },
      { reason: 'expired', count: 1 },
    ];
    expect(first.body).toMatchObject({ channel: CHANNEL, total: 3, byReason });
    expect(again.body).toEqual(first.body);
    expect(list.body.channels).toEqual([expect.objectContaining({ total: 3, byReason })]);
    expect(transport.box.browses).toBe(1);
  });

  it('looks among them when finding an id only when asked to', async () => {
    const plain = await admin.get<{ matches: unknown[] }>('find/order-0');
    expect(plain.body.matches).toEqual([]);
    expect(transport.box.browses).toBe(0);

    const asked = await admin.get<{ matches: unknown[] }>('find/order-0?deadLetters=1');
    expect(asked.body.matches).toEqual([
      expect.objectContaining({ kind: 'dead-letter', channel: CHANNEL }),
    ]);
  });

  it('records an action that failed as a whole, with its error', async () => {
    transport.box.failActions = true;
    const answer = await admin.post(`dead-letters/${CHANNEL}/replay`, { ids: ['some-id'] });

    expect(answer.status).toBe(500);
    expect(actions).toEqual([
      expect.objectContaining({
        type: 'admin.action',
        action: 'dead-letter.replay',
        targets: ['some-id'],
        changed: 0,
        error: 'the broker connection is gone',
      }),
    ]);
  });
});

describe('the admin API grouping dead letters by reason', () => {
  const transport = new InMemoryTransport();
  const MANY = 'admin-dead-letters.many';
  const BARE = 'admin-dead-letters.bare';
  const PADDED = 'admin-dead-letters.padded';
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { mutations: true, deadLetterChannels: [MANY, BARE, PADDED] },
      sequence: { transport },
    });
    for (let index = 0; index < 600; index++) {
      await transport.publish(transport.deadLetterChannel(MANY), Buffer.from(`m${index}`), {
        'x-death-reason': `integrity-mismatch: fragment ${index}`,
      });
    }
    // Dead letters without x-death-reason (put there by another system, or by a broker).
    for (const body of ['bare-1', 'bare-2']) {
      await transport.publish(transport.deadLetterChannel(BARE), Buffer.from(body), {});
    }
    await transport.publish(transport.deadLetterChannel(BARE), Buffer.from('timed out'), {
      'x-death-reason': 'expired: too old',
    });
    // Reasons another system padded with spaces, without a detail.
    for (const reason of [' ', 'expired ']) {
      await transport.publish(transport.deadLetterChannel(PADDED), Buffer.from(reason), {
        'x-death-reason': reason,
      });
    }
  });

  afterAll(() => admin.close());

  it('groups the first 1000 dead letters of a channel, beyond maxBatch (500)', async () => {
    const answer = await admin.get(`dead-letters/${MANY}/reasons`);
    expect(answer).toEqual({
      status: 200,
      body: expect.objectContaining({
        total: 600,
        byReason: [{ reason: 'integrity-mismatch', count: 600 }],
      }),
    });
  });

  it('finds no dead letter by the name of a header it lacks ("undefined", "null")', async () => {
    for (const id of ['undefined', 'null']) {
      const answer = await admin.get<{ matches: { kind: string }[] }>(`find/${id}`);
      expect(answer.status).toBe(200);
      expect(answer.body.matches.filter((match) => match.kind === 'dead-letter')).toEqual([]);
    }
  });

  it('lists the dead letters without a reason as the group "", and shows and acts on that group', async () => {
    const groups = await admin.get<{ byReason: unknown[] }>(`dead-letters/${BARE}/reasons`);
    expect(groups.body.byReason).toEqual([
      { reason: '', count: 2 },
      { reason: 'expired', count: 1 },
    ]);

    // `?reason=` (empty) shows that group; no reason at all, every dead letter.
    const shown = await admin.get<{ items: { reason: string }[] }>(`dead-letters/${BARE}?reason=`);
    expect(shown.body.items.map((item) => item.reason)).toEqual(['', '']);
    const all = await admin.get<{ items: unknown[] }>(`dead-letters/${BARE}`);
    expect(all.body.items).toHaveLength(3);

    const discard = await admin.post(`dead-letters/${BARE}/discard`, { reason: '' });
    expect(discard).toMatchObject({ status: 200, body: { changed: 2 } });
    const again = await admin.post(`dead-letters/${BARE}/replay`, { reason: '' });
    expect(again.body).toMatchObject({
      changed: 0,
      message: `nothing changed: channel ${BARE} has no dead letters without a reason`,
    });
    const left = await admin.get<{ byReason: unknown[] }>(`dead-letters/${BARE}/reasons`);
    expect(left.body.byReason).toEqual([{ reason: 'expired', count: 1 }]);
  });

  it('lists and acts on each group it shows, when reasons are padded and have no detail', async () => {
    const groups = await admin.get<{ byReason: { reason: string; count: number }[] }>(
      `dead-letters/${PADDED}/reasons`,
    );
    expect(groups.body.byReason).toEqual([
      { reason: '', count: 1 },
      { reason: 'expired', count: 1 },
    ]);
    for (const { reason, count } of groups.body.byReason) {
      const shown = await admin.get<{ items: unknown[] }>(
        `dead-letters/${PADDED}?reason=${encodeURIComponent(reason)}`,
      );
      expect({ reason, shown: shown.body.items.length }).toEqual({ reason, shown: count });
      const discard = await admin.post(`dead-letters/${PADDED}/discard`, { reason });
      expect({ reason, discard }).toMatchObject({ reason, discard: { body: { changed: count } } });
    }
  });
});

const OWN = 'admin-dead-letters.images';
const PARKED = 'admin-dead-letters.parked';

@Injectable()
class ParkingHandler {
  @SequencedHandler({ channel: OWN, deadLetterChannel: PARKED })
  async handle(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }
}

/** A handler's own `deadLetterChannel`: the console reads and acts on that channel. */
describe('the admin API over a channel with a dead-letter channel of its own', () => {
  const transport = new InMemoryTransport();
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { mutations: true },
      sequence: { transport },
      providers: [ParkingHandler],
    });
    for (const id of ['corrupt-1', 'corrupt-2']) {
      const [fragment] = makeFragments(id, bytes(2_000, 3), 1_000);
      await publishAll(transport, OWN, [{ ...fragment, body: Buffer.alloc(1_000) }]);
    }
    await transport.whenIdle();
    expect(transport.depth(PARKED)).toBe(2);
  });

  afterAll(() => admin.close());

  it('counts, lists and discards the dead letters in it', async () => {
    const summary = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');
    expect(summary.body.channels.find((entry) => entry.channel === OWN)).toMatchObject({
      deadLetterChannel: PARKED,
      total: 2,
    });
    const listed = await admin.get<{ items: { id: string; deadLetterChannel: string }[] }>(
      `dead-letters/${OWN}`,
    );
    expect(listed.body.items.map((item) => item.deadLetterChannel)).toEqual([PARKED, PARKED]);

    const discard = await admin.post(`dead-letters/${OWN}/discard`, {
      ids: [listed.body.items[0].id],
    });
    expect(discard).toMatchObject({ status: 200, body: { changed: 1 } });
    expect(transport.depth(PARKED)).toBe(1);
  });

  it('replays them to the channel they came from', async () => {
    const replay = await admin.post(`dead-letters/${OWN}/replay`, { all: true });
    expect(replay).toMatchObject({ status: 200, body: { changed: 1 } });
    await transport.whenIdle();
    // Corrupt still: dead-lettered again into the handler's channel, counted as replayed once.
    const listed = await admin.get<{ items: { replays: number }[] }>(`dead-letters/${OWN}`);
    expect(listed.body.items.map((item) => item.replays)).toEqual([1]);
  });
});

/** A transport whose dead-letter channels are `<channel>.dead` (as RabbitMQ's `deadLetterSuffix`). */
class SuffixTransport extends InMemoryTransport {
  override deadLetterChannel(channel: string): string {
    return `${channel}.dead`;
  }
}

describe('the admin API on a transport that names dead-letter channels its own way', () => {
  const transport = new SuffixTransport();
  const OTHER = 'admin-dead-letters.other';
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { deadLetterChannels: [OTHER] },
      sequence: { transport },
    });
  });

  afterAll(() => admin.close());

  it("names the transport's dead-letter channel", async () => {
    const answer = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');
    expect(answer.body.channels.find((entry) => entry.channel === OTHER)).toMatchObject({
      deadLetterChannel: `${OTHER}.dead`,
    });
  });
});
