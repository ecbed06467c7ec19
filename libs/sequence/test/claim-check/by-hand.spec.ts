import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import {
  ClaimCheckNotFoundError,
  ClaimTicketInvalidError,
  UnknownPayloadStoreError,
} from 'nest-sequence';
import { type ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  fieldsOf,
  signedByApp,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/** Claim Check by hand: `checkIn` a payload, `checkOut` its ticket, `release` it. */
describe('claim check: checkIn, checkOut and release by hand', () => {
  const payload = bytes(10_000, 1);
  const sha256 = createHash('sha256').update(payload).digest('hex');
  let t: ClaimCheckTestApp;
  beforeEach(async () => {
    t = await createClaimCheckTestApp();
  });
  afterEach(() => t.close());

  describe('checkIn', () => {
    it('returns a signed ticket describing the payload', async () => {
      const before = Date.now();
      const ticket = await t.claimCheck.checkIn(payload, { contentType: 'image/png' });
      const after = Date.now();

      expect(ticket).toMatchObject({
        v: 2,
        audience: [],
        store: 'filesystem',
        bytes: payload.length,
        sha256,
        contentType: 'image/png',
        kid: t.options.claimCheck.keyring.signingKeyId,
      });
      expect(ticket.expiresAt).toBeGreaterThanOrEqual(before + t.options.claimCheck.ttlMs);
      expect(ticket.expiresAt).toBeLessThanOrEqual(after + t.options.claimCheck.ttlMs);
      expect(ticket.sig).toMatch(/^[A-Za-z0-9_-]{43}$/);
      expect(await t.store.head(ticket.ref)).toMatchObject({
        bytes: payload.length,
        contentType: 'image/png',
        expiresAt: ticket.expiresAt,
      });
    });

    it('honours a ttl of its own', async () => {
      const before = Date.now();
      const ticket = await t.claimCheck.checkIn(payload, { ttlMs: 5_000 });
      expect(ticket.expiresAt - before).toBeGreaterThanOrEqual(5_000);
      expect(ticket.expiresAt - before).toBeLessThan(6_000);
    });

    it('streams a Readable into the store and describes what flowed', async () => {
      const ticket = await t.claimCheck.checkIn(
        Readable.from([payload.subarray(0, 3_000), payload.subarray(3_000)]),
      );
      expect(ticket).toMatchObject({ bytes: payload.length, sha256 });
      expect((await (await t.claimCheck.checkOut(ticket)).toBuffer()).equals(payload)).toBe(true);
    });

    it('refuses an object-mode stream with a TypeError, storing nothing and throwing nowhere else', async () => {
      const uncaught: unknown[] = [];
      const onUncaught = (error: unknown) => void uncaught.push(error);
      process.prependListener('uncaughtException', onUncaught);
      const put = jest.spyOn(t.store, 'put');
      try {
        const source = Readable.from([payload.subarray(0, 5_000), { not: 'bytes' }], {
          objectMode: true,
        });
        await expect(t.claimCheck.checkIn(source)).rejects.toThrow(TypeError);
        // The store was handed the stream, and its put failed with it: nothing kept.
        const putting = put.mock.results[0]?.value as Promise<unknown> | undefined;
        const stored = await putting?.then(
          () => 'stored',
          () => 'refused',
        );
        expect({ stored, uncaught }).toEqual({ stored: 'refused', uncaught: [] });
      } finally {
        process.removeListener('uncaughtException', onUncaught);
      }
    });

    it('deletes what it stored when no ticket can be made for it (a ref too long for a ticket)', async () => {
      const deleted: string[] = [];
      const u = await createClaimCheckTestApp({
        wrapStore: (store) =>
          Object.assign(Object.create(store) as typeof store, {
            put: async (...args: Parameters<typeof store.put>) => ({
              ...(await store.put(...args)),
              ref: 'r'.repeat(600),
            }),
            delete: async (ref: string) => {
              deleted.push(ref);
              return true;
            },
          }),
      });
      try {
        await expect(u.claimCheck.checkIn(Buffer.from('scan'))).rejects.toThrow();
        expect(deleted).toEqual(['r'.repeat(600)]);
      } finally {
        await u.close();
      }
    });

    it('closes a stream whose options it refuses (a file handle is not left open)', async () => {
      const source = Readable.from([Buffer.from('scan')]);

      await expect(t.claimCheck.checkIn(source, { ttlMs: 0 })).rejects.toThrow(/ttlMs/);
      expect(source.destroyed).toBe(true);
    });

    it('hands the payload to the caller: never swept as an orphan', async () => {
      const ticket = await t.claimCheck.checkIn(payload);
      const report = await t.sweeper.sweep(Date.now() + t.options.claimCheck.orphanGraceMs + 1);
      expect(report).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.store.head(ticket.ref)).toMatchObject({ published: true });
    });

    it('counts payloads and bytes checked in', async () => {
      await t.claimCheck.checkIn(payload);
      await t.claimCheck.checkIn(Buffer.alloc(5));
      const labels = { store: 'filesystem' };
      expect(await claimMetric(t, 'payloads_checked_in_total', labels)).toBe(2);
      expect(await claimMetric(t, 'bytes_stored_total', labels)).toBe(payload.length + 5);
    });
  });

  describe('checkOut', () => {
    let ticket: ClaimTicket;
    beforeEach(async () => {
      ticket = await t.claimCheck.checkIn(payload, {
        contentType: 'image/png',
        metadata: { study: 'S-1' },
      });
    });

    it('returns the payload, its description and metadata', async () => {
      const claimed = await t.claimCheck.checkOut(ticket, { 'x-from': 'test' });
      expect(claimed).toMatchObject({
        via: 'ticket',
        bytes: payload.length,
        contentType: 'image/png',
        metadata: { study: 'S-1' },
        headers: { 'x-from': 'test' },
      });
      expect((await claimed.toBuffer()).equals(payload)).toBe(true);
      expect(await claimMetric(t, 'payloads_checked_out_total', { store: 'filesystem' })).toBe(1);
    });

    it('reads the bytes again on each stream()', async () => {
      const claimed = await t.claimCheck.checkOut(ticket);
      expect((await claimed.toBuffer()).equals(payload)).toBe(true);
      expect((await claimed.toBuffer()).equals(payload)).toBe(true);
    });

    it('leaves the payload in the store', async () => {
      await (await t.claimCheck.checkOut(ticket)).toBuffer();
      expect(await t.store.head(ticket.ref)).toBeDefined();
    });

    it('leaves it to the sweeper after its expiry, never before', async () => {
      await (await t.claimCheck.checkOut(ticket)).toBuffer();
      const { orphanGraceMs, expiredGraceMs } = t.options.claimCheck;
      expect(await t.sweeper.sweep(Date.now() + orphanGraceMs + 1)).toEqual({
        expired: 0,
        orphaned: 0,
      });
      expect(await t.sweeper.sweep(ticket.expiresAt + expiredGraceMs)).toEqual({
        expired: 1,
        orphaned: 0,
      });
    });

    it('marks published a payload its sender left unmarked: its ticket is out', async () => {
      // What publish() leaves when its process dies between the broker's confirm and the mark.
      const now = Date.now();
      const expiresAt = now + t.options.claimCheck.ttlMs;
      const { ref } = await t.store.put(payload, { now, expiresAt, published: false });
      const unmarked = signedByApp(t, {
        store: t.store.name,
        ref,
        bytes: payload.length,
        sha256,
        expiresAt,
        audience: [],
      });

      const claimed = await t.claimCheck.checkOut(unmarked);
      const later = now + t.options.claimCheck.orphanGraceMs + 60_000;
      expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
      expect((await claimed.toBuffer()).equals(payload)).toBe(true);
    });

    it.each<[string, (fields: Record<string, unknown>) => void, string]>([
      [
        'a tampered ref',
        (f) => (f.ref = String(f.ref).replace(/.$/, (c) => (c === '0' ? '1' : '0'))),
        'bad-signature',
      ],
      ['a tampered size', (f) => (f.bytes = 1), 'bad-signature'],
      ['no signature', (f) => delete f.sig, 'unsigned'],
      ['an unknown key id', (f) => (f.kid = 'nobody'), 'unknown-key'],
    ])('throws ClaimTicketInvalidError for %s', async (_what, change, reason) => {
      const forged: Record<string, unknown> = { ...ticket };
      change(forged);
      const error: unknown = await t.claimCheck.checkOut(forged).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ClaimTicketInvalidError);
      expect((error as ClaimTicketInvalidError).reason).toBe(reason);
    });

    it('throws ClaimTicketInvalidError for an expired ticket', async () => {
      const short = await t.claimCheck.checkIn(payload, { ttlMs: 500 });
      await new Promise((resolve) => setTimeout(resolve, 600));
      await expect(t.claimCheck.checkOut(short)).rejects.toMatchObject({
        name: 'ClaimTicketInvalidError',
        reason: 'expired',
      });
    });

    it('throws UnknownPayloadStoreError for a store this side does not have', async () => {
      const elsewhere = signedByApp(t, { ...fieldsOf(ticket), store: 'archive' });
      await expect(t.claimCheck.checkOut(elsewhere)).rejects.toBeInstanceOf(
        UnknownPayloadStoreError,
      );
    });
  });

  describe('release', () => {
    it('deletes the payload: true, then false', async () => {
      const ticket = await t.claimCheck.checkIn(payload);
      expect(await t.claimCheck.release(ticket)).toBe(true);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
      expect(await t.claimCheck.release(ticket)).toBe(false);
    });

    it('after release, checkOut throws ClaimCheckNotFoundError', async () => {
      const ticket = await t.claimCheck.checkIn(payload);
      await t.claimCheck.release(ticket);
      const error: unknown = await t.claimCheck.checkOut(ticket).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ClaimCheckNotFoundError);
      expect(error).toMatchObject({ store: 'filesystem', ref: ticket.ref });
    });

    it('accepts an expired ticket: expiry is no reason to keep a payload', async () => {
      const ticket = await t.claimCheck.checkIn(payload, { ttlMs: 500 });
      await new Promise((resolve) => setTimeout(resolve, 600));
      expect(await t.claimCheck.release(ticket)).toBe(true);
    });

    it('refuses a tampered ticket and deletes nothing', async () => {
      const ticket = await t.claimCheck.checkIn(payload);
      const other = await t.claimCheck.checkIn(Buffer.from('other'));
      // The other payload's ref under this ticket's signature: a forged delete.
      await expect(t.claimCheck.release({ ...ticket, ref: other.ref })).rejects.toBeInstanceOf(
        ClaimTicketInvalidError,
      );
      expect(await t.store.head(other.ref)).toBeDefined();
      expect(await t.store.head(ticket.ref)).toBeDefined();
    });
  });
});
