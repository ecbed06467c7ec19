import { randomBytes, randomUUID } from 'node:crypto';
import type { HeaderMap } from '../../core/headers';
import {
  MAX_DEAD_LETTER_BROWSE,
  REPLAY_COUNT_HEADER,
  REPLAYED_AT_HEADER,
  type DeadLetter,
  type DeadLetterBox,
} from '../../ports/dead-letter-box.port';
import {
  headerBytes,
  type InboundMessage,
  type Subscription,
  type Transport,
} from '../../ports/transport.port';
import { eventually, type TransportHarness } from './transport.conformance';

/**
 * As {@link TransportHarness}, for a transport that defines `deadLetters()`. Give it a modest
 * `maxMessageBytes` (64 KiB to a few MiB): one case dead-letters a message of exactly that size.
 */
export interface DeadLetterBoxHarness extends TransportHarness {
  /**
   * False where browsing may change the order of the dead letters it puts back (RabbitMQ quorum
   * queues): the cases then check which dead letters a browse shows, not their order.
   * @default true
   */
  readonly browseKeepsOrder?: boolean;
}

const REASON_HEADER = 'x-conformance-reason';
const SENTINEL = 'x-conformance-sentinel';
const DEATH_REASON = 'x-death-reason';
/** Fast enough not to slow the suite where pacing is not the point. */
const FAST = { ratePerSecond: 1_000 };

/**
 * The behaviour of every {@link DeadLetterBox} a transport's `deadLetters()` returns (see the
 * port's contract). Dead letters are made the way the module makes them: a subscriber of the
 * channel answers `dead-letter`. Each case uses channels of its own (`conf-dlq.<uuid>`).
 */
export function describeDeadLetterBoxConformance(
  adapterName: string,
  harness: DeadLetterBoxHarness,
): void {
  describe(`DeadLetterBox conformance: ${adapterName}`, () => {
    let transport: Transport;
    let box: DeadLetterBox;
    let subscriptions: Subscription[];

    beforeEach(async () => {
      transport = await harness.create();
      if (!transport.deadLetters) throw new Error(`${transport.name} does not define deadLetters`);
      box = transport.deadLetters();
      subscriptions = [];
    });

    afterEach(async () => {
      for (const subscription of subscriptions) await subscription.close().catch(() => undefined);
      await (harness.close ? harness.close(transport) : transport.close());
    });

    const newChannel = (): string => `conf-dlq.${randomUUID()}`;
    const keepsOrder = harness.browseKeepsOrder ?? true;
    /** `values` as the order of a browse can be checked: as they are, or sorted. */
    const ordered = <T>(values: readonly T[]): T[] =>
      keepsOrder ? [...values] : [...values].sort();

    /**
     * A channel whose subscriber dead-letters every message it has not seen replayed (with the
     * reason in its {@link REASON_HEADER}) and records the replayed ones. With `failReplays`, it
     * dead-letters those too.
     */
    async function deadLettering(channel: string, options: { failReplays?: boolean } = {}) {
      const replayed: InboundMessage[] = [];
      const subscription = await transport.subscribe(
        channel,
        async (message) => {
          const isReplay = message.headers[REPLAY_COUNT_HEADER] !== undefined;
          if (message.headers[SENTINEL] === true || (isReplay && !options.failReplays)) {
            replayed.push(message);
            return { action: 'ack' };
          }
          return { action: 'dead-letter', reason: String(message.headers[REASON_HEADER]) };
        },
        // One at a time: dead letters reach the dead-letter channel in publication order.
        { prefetch: 1 },
      );
      subscriptions.push(subscription);
      return { replayed, subscription };
    }

    /** Publishes messages the subscriber dead-letters, and waits until browse shows them all. */
    async function seed(
      channel: string,
      letters: ReadonlyArray<{ body?: Buffer; reason: string; headers?: HeaderMap }>,
    ): Promise<DeadLetter[]> {
      for (const [index, letter] of letters.entries()) {
        const body = letter.body ?? Buffer.from(`dead letter ${index}`);
        const headers = { ...letter.headers, [REASON_HEADER]: letter.reason, 'x-index': index };
        await transport.publish(channel, body, headers);
      }
      const items = await waitForDeadLetters(channel, letters.length);
      const index = (letter: DeadLetter) => Number(letter.headers['x-index']);
      return keepsOrder ? items : items.sort((a, b) => index(a) - index(b));
    }

    async function waitForDeadLetters(channel: string, count: number): Promise<DeadLetter[]> {
      return until(async () => {
        const { items } = await box.browse(channel, { limit: MAX_DEAD_LETTER_BROWSE });
        return items.length >= count ? [...items] : undefined;
      }, `${count} dead letters`);
    }

    /** What else reaches `received` before a sentinel published now: proves nothing more came. */
    async function extraDeliveries(channel: string, received: InboundMessage[]): Promise<number> {
      const before = received.length;
      await transport.publish(channel, Buffer.from('sentinel'), { [SENTINEL]: true });
      await eventually(() => received.some((m) => m.headers[SENTINEL] === true), 'the sentinel');
      return received.findIndex((m) => m.headers[SENTINEL] === true) - before;
    }

    it('browses an empty or unknown dead-letter channel as empty', async () => {
      const page = await box.browse(newChannel(), { limit: 10 });
      expect(page.items).toEqual([]);
      if (page.total !== undefined) expect(page.total).toBe(0);
    });

    it('reads a channel whose name is too long for the broker to hold as empty', async () => {
      const channel = `${newChannel()}.${'x'.repeat(300)}`;

      expect([0, undefined]).toContain(await box.count(channel));
      expect((await box.browse(channel, { limit: 10 })).items).toEqual([]);
      expect(await box.body(channel, 'no-such-id')).toBeUndefined();
      expect(await box.discard(channel, ['no-such-id'])).toEqual({
        done: [],
        missing: ['no-such-id'],
        failed: [],
      });
    });

    it('refuses a limit outside 1..MAX_DEAD_LETTER_BROWSE with a RangeError', async () => {
      const channel = newChannel();
      for (const limit of [0, -1, 1.5, MAX_DEAD_LETTER_BROWSE + 1]) {
        await expect(box.browse(channel, { limit })).rejects.toThrow(RangeError);
      }
    });

    it('shows dead letters oldest first, with reason, headers, size and ids, without removing them', async () => {
      const channel = newChannel();
      await deadLettering(channel);
      const items = await seed(channel, [
        { reason: 'integrity-mismatch: crc32 of fragment 3', headers: { 'x-user': 'kept' } },
        { reason: 'sequence-expired: 2 of 5 fragments' },
      ]);

      const page = await box.browse(channel, { limit: 10 });
      expect(ordered(page.items.map((item) => item.headers['x-index']))).toEqual([0, 1]);
      const [first] = items;
      expect(first).toMatchObject({
        channel,
        deadLetterChannel: transport.deadLetterChannel(channel),
        reason: 'integrity-mismatch: crc32 of fragment 3',
        replays: 0,
      });
      expect(first.headers).toMatchObject({
        'x-user': 'kept',
        [DEATH_REASON]: 'integrity-mismatch: crc32 of fragment 3',
      });
      expect(first.bytes).toBeGreaterThanOrEqual('dead letter 0'.length);
      expect(new Set(items.map((item) => item.id)).size).toBe(2);

      // Browsing again removes nothing and gives the same ids.
      const again = await box.browse(channel, { limit: 10 });
      expect(ordered(again.items.map((item) => item.id))).toEqual(ordered(items.map((i) => i.id)));
      if (again.total !== undefined) expect(again.total).toBe(2);
    });

    it('filters by reason (whole or code) and stops at limit', async () => {
      const channel = newChannel();
      await deadLettering(channel);
      await seed(channel, [
        { reason: 'integrity-mismatch: one' },
        { reason: 'sequence-expired: two' },
        { reason: 'integrity-mismatch: three' },
        { reason: 'integrity-mismatch: four' },
      ]);

      const byCode = await box.browse(channel, { limit: 10, reason: 'integrity-mismatch' });
      expect(ordered(byCode.items.map((item) => item.reason))).toEqual(
        ordered([
          'integrity-mismatch: one',
          'integrity-mismatch: three',
          'integrity-mismatch: four',
        ]),
      );
      const whole = await box.browse(channel, { limit: 10, reason: 'sequence-expired: two' });
      expect(whole.items.map((item) => item.reason)).toEqual(['sequence-expired: two']);
      const limited = await box.browse(channel, { limit: 2, reason: 'integrity-mismatch' });
      const firstTwo = ['integrity-mismatch: one', 'integrity-mismatch: three'];
      if (keepsOrder) expect(limited.items.map((item) => item.reason)).toEqual(firstTwo);
      expect(limited.items).toHaveLength(2);
      for (const item of limited.items) expect(item.reason).toMatch(/^integrity-mismatch: /);
      const none = await box.browse(channel, { limit: 10, reason: 'integrity' });
      expect(none.items).toEqual([]);
    });

    it('gives the body byte-exact, and undefined for an id it does not hold', async () => {
      const channel = newChannel();
      await deadLettering(channel);
      const body = Buffer.concat([Buffer.from([0, 255, 1]), randomBytes(2048)]);
      const [letter] = await seed(channel, [{ body, reason: 'poison: x' }]);

      expect((await box.body(channel, letter.id))?.equals(body)).toBe(true);
      expect(await box.body(channel, `${letter.id}-unknown`)).toBeUndefined();
    });

    it('replays to a subscriber of the original channel, with the headers, and removes what it replayed', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      const body = randomBytes(512);
      const [first, second] = await seed(channel, [
        { body, reason: 'handler-failed: boom', headers: { 'x-user': 'kept', 'x-n': 7 } },
        { reason: 'handler-failed: other' },
      ]);

      const result = await box.replay(channel, [first.id], FAST);

      expect(result).toEqual({ done: [first.id], missing: [], failed: [] });
      await eventually(() => replayed.length === 1, 'the replayed message');
      const [message] = replayed;
      expect(message.body.equals(body)).toBe(true);
      expect(message.headers).toMatchObject({
        'x-user': 'kept',
        'x-n': 7,
        [REPLAY_COUNT_HEADER]: 1,
      });
      expect(message.headers[DEATH_REASON]).toBeUndefined();
      expect(typeof message.headers[REPLAYED_AT_HEADER]).toBe('number');
      const left = await box.browse(channel, { limit: 10 });
      expect(left.items.map((item) => item.id)).toEqual([second.id]);
    });

    it('reports an id replayed already as missing, and changes nothing', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      const [first, second] = await seed(channel, [{ reason: 'a: 1' }, { reason: 'a: 2' }]);
      await box.replay(channel, [first.id], FAST);
      await eventually(() => replayed.length === 1, 'the replayed message');

      const again = await box.replay(channel, [first.id, 'no-such-id'], FAST);

      expect(again).toEqual({ done: [], missing: [first.id, 'no-such-id'], failed: [] });
      expect(await extraDeliveries(channel, replayed)).toBe(0);
      const left = await box.browse(channel, { limit: 10 });
      expect(left.items.map((item) => item.id)).toEqual([second.id]);
    });

    it('dead-letters a replayed message that fails again with its replay count carried', async () => {
      const channel = newChannel();
      await deadLettering(channel, { failReplays: true });
      const [letter] = await seed(channel, [{ reason: 'handler-failed: still broken' }]);

      await box.replay(channel, [letter.id], FAST);
      const [back] = (await waitForDeadLetters(channel, 1)).filter((l) => l.replays === 1);
      expect(back).toBeDefined();
      expect(back.id).not.toBe(letter.id);
      expect(back.headers[REPLAY_COUNT_HEADER]).toBe(1);

      await box.replay(channel, [back.id], FAST);
      const twice = await until(async () => {
        const page = await box.browse(channel, { limit: 10 });
        return page.items.find((item) => item.replays === 2);
      }, 'the dead letter replayed twice');
      expect(twice.headers[REPLAY_COUNT_HEADER]).toBe(2);
    });

    it('replays concurrently asked ids once each', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      const letters = await seed(channel, [{ reason: 'a: 1' }, { reason: 'a: 2' }]);
      const ids = letters.map((letter) => letter.id);

      const results = await Promise.all([
        box.replay(channel, ids, FAST),
        box.replay(channel, ids, FAST),
      ]);

      const done = results.flatMap((result) => result.done);
      expect([...done].sort()).toEqual([...ids].sort());
      expect(results.flatMap((result) => result.failed)).toEqual([]);
      await eventually(() => replayed.length === 2, 'the replayed messages');
      expect(await extraDeliveries(channel, replayed)).toBe(0);
    });

    it('paces replays to ratePerSecond: the first is delivered while the others wait their turn', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      const letters = await seed(channel, [
        { reason: 'a: 1' },
        { reason: 'a: 2' },
        { reason: 'a: 3' },
      ]);
      let finished = false;
      let replayedWhenFirstArrived = -1;
      let finishedWhenFirstArrived = true;
      void eventually(() => replayed.length > 0, 'the first replay').then(() => {
        replayedWhenFirstArrived = replayed.length;
        finishedWhenFirstArrived = finished;
      });

      // One per second: the second publish comes a whole second after the first.
      const result = await box.replay(
        channel,
        letters.map((letter) => letter.id),
        { ratePerSecond: 1 },
      );
      finished = true;

      expect(result.done).toHaveLength(3);
      expect(replayedWhenFirstArrived).toBe(1);
      expect(finishedWhenFirstArrived).toBe(false);
      await eventually(() => replayed.length === 3, 'every replay');
    });

    it('refuses a ratePerSecond that is not a positive number', async () => {
      const channel = newChannel();
      for (const ratePerSecond of [0, -1, Number.NaN, Infinity]) {
        await expect(box.replay(channel, ['1'], { ratePerSecond })).rejects.toThrow(RangeError);
      }
    });

    it('keeps a dead letter whose replay fails (too large to go back), and replays the others', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      // Exactly the largest message: back with its replay headers instead of a short reason, it
      // no longer fits.
      const headers: HeaderMap = { [REASON_HEADER]: 'r', 'x-index': 0 };
      const size = transport.maxMessageBytes - headerBytes(headers);
      await transport.publish(channel, Buffer.alloc(size, 7), headers);
      const [large] = await waitForDeadLetters(channel, 1);
      await transport.publish(channel, Buffer.from('small'), { [REASON_HEADER]: 'r' });
      const small = (await waitForDeadLetters(channel, 2)).find((item) => item.id !== large.id)!;

      const result = await box.replay(channel, [large.id, small.id], FAST);

      expect(result.done).toEqual([small.id]);
      expect(result.missing).toEqual([]);
      expect(result.failed.map((failure) => failure.id)).toEqual([large.id]);
      expect(result.failed[0].error).toMatch(/./);
      const left = await box.browse(channel, { limit: 10 });
      expect(left.items.map((item) => item.id)).toEqual([large.id]);
      await eventually(() => replayed.length === 1, 'the small replay');
    });

    it('discards for good: gone from browse, never delivered, missing the second time', async () => {
      const channel = newChannel();
      const { replayed } = await deadLettering(channel);
      const [first, second] = await seed(channel, [{ reason: 'a: 1' }, { reason: 'a: 2' }]);

      expect(await box.discard(channel, [first.id])).toEqual({
        done: [first.id],
        missing: [],
        failed: [],
      });
      expect(await box.discard(channel, [first.id])).toEqual({
        done: [],
        missing: [first.id],
        failed: [],
      });
      const left = await box.browse(channel, { limit: 10 });
      expect(left.items.map((item) => item.id)).toEqual([second.id]);
      expect(await box.body(channel, first.id)).toBeUndefined();
      expect(await box.replay(channel, [first.id], FAST)).toEqual({
        done: [],
        missing: [first.id],
        failed: [],
      });
      expect(await extraDeliveries(channel, replayed)).toBe(0);
    });

    it('reads and acts on a dead-letter channel given at subscribe, when told where it is', async () => {
      const channel = newChannel();
      const at = { deadLetterChannel: `${newChannel()}.parked` };
      const replayed: InboundMessage[] = [];
      const subscription = await transport.subscribe(
        channel,
        async (message) => {
          if (message.headers[REPLAY_COUNT_HEADER] !== undefined) {
            replayed.push(message);
            return { action: 'ack' };
          }
          return { action: 'dead-letter', reason: 'parked: elsewhere' };
        },
        { prefetch: 1, deadLetterChannel: at.deadLetterChannel },
      );
      subscriptions.push(subscription);
      for (const index of [0, 1]) await transport.publish(channel, Buffer.from(`p${index}`), {});
      // Counted first (the broker's count, no message read): a quorum queue just declared may
      // not serve a read yet, and RabbitMQ answers one with an error on the whole connection.
      await until(async () => {
        const counted = await box.count(channel, at);
        return counted === undefined || counted >= 2 ? true : undefined;
      }, 'both dead letters counted in the given channel');
      const items = await until(async () => {
        const page = await box.browse(channel, { limit: 10, ...at });
        return page.items.length >= 2 ? page.items : undefined;
      }, 'both dead letters in the given channel');

      expect(items.map((item) => [item.channel, item.deadLetterChannel])).toEqual([
        [channel, at.deadLetterChannel],
        [channel, at.deadLetterChannel],
      ]);
      expect((await box.browse(channel, { limit: 10 })).items).toEqual([]);
      expect(await box.count(channel, at)).toBe(2);
      expect(await box.body(channel, items[0].id, at)).toBeDefined();
      expect(await box.discard(channel, [items[0].id], at)).toMatchObject({ done: [items[0].id] });
      expect(await box.replay(channel, [items[1].id], { ...FAST, ...at })).toMatchObject({
        done: [items[1].id],
      });
      await eventually(() => replayed.length === 1, 'the replay, on the original channel');
      expect(await box.count(channel, at)).toBe(0);
    });
  });
}

/** Polls `check` until it gives a value; fails naming `what` after `timeoutMs`. */
async function until<T>(
  check: () => Promise<T | undefined>,
  what: string,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
