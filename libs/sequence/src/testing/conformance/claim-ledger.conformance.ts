import { randomUUID } from 'node:crypto';
import type { ClaimKey, ClaimLedger } from '../../ports/claim-ledger.port';

export interface ClaimLedgerHarness {
  /** A fresh, empty ledger (for a server-backed ledger: under a key prefix of its own). */
  create(): Promise<ClaimLedger>;
  /**
   * Another instance over the same shared state, as a second consumer instance would have it
   * (its own connection for a server-backed ledger; the ledger itself for an in-process one).
   * Closed by the suite with `close`.
   */
  peer(ledger: ClaimLedger): Promise<ClaimLedger>;
  /** Closes a ledger (created or peer) and cleans up; `ledger.close()` when absent. */
  close?(ledger: ClaimLedger): Promise<void>;
}

const LEASE_MS = 30_000;
/** Long enough that a server-side TTL never interferes with a test. */
const RETAIN_MS = 3_600_000;

/**
 * The {@link ClaimLedger} contract, run against every adapter. Times are explicit `now` values
 * near the real clock, so that adapters that also keep server-side TTLs see realistic ones.
 */
export function describeClaimLedgerConformance(name: string, harness: ClaimLedgerHarness): void {
  describe(`ClaimLedger conformance: ${name}`, () => {
    let ledger: ClaimLedger;
    let opened: ClaimLedger[];
    let key: ClaimKey;
    let t0: number;

    beforeEach(async () => {
      ledger = await harness.create();
      opened = [ledger];
      key = { ticket: `filesystem:${randomUUID()}`, group: 'orders.created' };
      t0 = Date.now();
    });

    afterEach(async () => {
      // Peers first: the ledger they share state with is cleaned up last.
      for (const each of [...new Set(opened)].reverse()) {
        await (harness.close ? harness.close(each) : each.close());
      }
    });

    async function peer(): Promise<ClaimLedger> {
      const other = await harness.peer(ledger);
      opened.push(other);
      return other;
    }

    const otherGroup = (group: string): ClaimKey => ({ ...key, group });

    it('has a name and answers ping', async () => {
      expect(typeof ledger.name).toBe('string');
      expect(ledger.name.length).toBeGreaterThan(0);
      await expect(ledger.ping()).resolves.toBeUndefined();
    });

    it('grants the first claim of a ticket', async () => {
      await expect(ledger.claim(key, 'a', LEASE_MS, t0)).resolves.toBe('claimed');
    });

    it('answers done to a claim after the group completed the ticket (a duplicate delivery)', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0 + 10);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 20)).resolves.toBe('done');
      await expect(ledger.claim(key, 'a', LEASE_MS, t0 + 20)).resolves.toBe('done');
    });

    it('shows a completion to every instance', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0 + 10);
      await expect((await peer()).claim(key, 'b', LEASE_MS, t0 + 20)).resolves.toBe('done');
    });

    it('answers busy to another holder while the lease is live', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1)).resolves.toBe('busy');
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + LEASE_MS - 1)).resolves.toBe('busy');
    });

    it('lets another holder take a lapsed lease over, which then excludes the first', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + LEASE_MS)).resolves.toBe('claimed');
      await expect(ledger.claim(key, 'a', LEASE_MS, t0 + LEASE_MS + 1)).resolves.toBe('busy');
    });

    it('renews the lease when its holder claims again', async () => {
      await ledger.claim(key, 'a', 1_000, t0);
      await expect(ledger.claim(key, 'a', 1_000, t0 + 900)).resolves.toBe('claimed');
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1_500)).resolves.toBe('busy');
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1_900)).resolves.toBe('claimed');
    });

    it('lets another holder claim at once after the holder releases', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.release(key, 'a');
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1)).resolves.toBe('claimed');
    });

    it('ignores a release by someone who does not hold the lease', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.release(key, 'b');
      await expect(ledger.claim(key, 'c', LEASE_MS, t0 + 1)).resolves.toBe('busy');
    });

    it('does not complete a ticket when its lease is released', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.release(key, 'a');
      await expect(ledger.claim(key, 'a', LEASE_MS, t0 + 1)).resolves.toBe('claimed');
    });

    it('counts distinct completed groups, and a repeated completion once', async () => {
      const retainUntil = t0 + RETAIN_MS;
      await expect(ledger.complete(key, 'a', retainUntil, t0)).resolves.toEqual({
        groups: 1,
        first: true,
      });
      await expect(ledger.complete(key, 'a', retainUntil, t0 + 1)).resolves.toEqual({
        groups: 1,
        first: false,
      });
      await expect(ledger.complete(otherGroup('audit'), 'b', retainUntil, t0 + 2)).resolves.toEqual(
        { groups: 2, first: true },
      );
      await expect(
        ledger.complete(otherGroup('billing'), 'c', retainUntil, t0 + 3),
      ).resolves.toEqual({ groups: 3, first: true });
      await expect(ledger.complete(otherGroup('audit'), 'd', retainUntil, t0 + 4)).resolves.toEqual(
        { groups: 3, first: false },
      );
    });

    it('counts completions of one ticket only', async () => {
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0);
      const other: ClaimKey = { ticket: `filesystem:${randomUUID()}`, group: key.group };
      await expect(ledger.complete(other, 'a', t0 + RETAIN_MS, t0)).resolves.toEqual({
        groups: 1,
        first: true,
      });
    });

    it("keeps groups independent: one group's completion is not another's", async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0 + 1);
      await expect(ledger.claim(otherGroup('audit'), 'a', LEASE_MS, t0 + 2)).resolves.toBe(
        'claimed',
      );
    });

    it("keeps groups independent: one group's lease does not block another", async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await expect(ledger.claim(otherGroup('audit'), 'b', LEASE_MS, t0 + 1)).resolves.toBe(
        'claimed',
      );
      await ledger.release(otherGroup('audit'), 'b');
      await expect(ledger.claim(key, 'c', LEASE_MS, t0 + 2)).resolves.toBe('busy');
    });

    it('keeps tickets independent: a completion of one ticket is not one of another', async () => {
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0);
      const other: ClaimKey = { ticket: `${key.ticket}x`, group: key.group };
      await expect(ledger.claim(other, 'a', LEASE_MS, t0 + 1)).resolves.toBe('claimed');
    });

    it("completes after the holder's lease lapsed, and ends the lease of whoever took over", async () => {
      await ledger.claim(key, 'a', 1_000, t0);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 2_000)).resolves.toBe('claimed');
      await expect(ledger.complete(key, 'a', t0 + RETAIN_MS, t0 + 3_000)).resolves.toEqual({
        groups: 1,
        first: true,
      });
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 3_001)).resolves.toBe('done');
      await expect(ledger.complete(key, 'b', t0 + RETAIN_MS, t0 + 3_002)).resolves.toEqual({
        groups: 1,
        first: false,
      });
    });

    it('forgets a completion at its retainUntil: the ticket can be claimed again', async () => {
      await ledger.complete(key, 'a', t0 + 1_000, t0);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 999)).resolves.toBe('done');
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1_000)).resolves.toBe('claimed');
      await expect(ledger.complete(key, 'b', t0 + RETAIN_MS, t0 + 1_001)).resolves.toEqual({
        groups: 1,
        first: true,
      });
    });

    it('counts only the completions still retained', async () => {
      await ledger.complete(key, 'a', t0 + 1_000, t0);
      await expect(
        ledger.complete(otherGroup('audit'), 'b', t0 + RETAIN_MS, t0 + 2_000),
      ).resolves.toEqual({
        groups: 1,
        first: true,
      });
    });

    it('keeps a repeated completion until the later of its retainUntil values', async () => {
      await ledger.complete(key, 'a', t0 + 5_000, t0);
      await ledger.complete(key, 'a', t0 + 1_000, t0 + 1);
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 4_999)).resolves.toBe('done');
    });

    it('grants exactly one of 20 concurrent claims from different instances', async () => {
      const instances = [ledger, ...(await Promise.all(Array.from({ length: 3 }, () => peer())))];
      const outcomes = await Promise.all(
        Array.from({ length: 20 }, (_, index) =>
          instances[index % instances.length].claim(key, `holder-${index}`, LEASE_MS, t0),
        ),
      );
      expect(outcomes.filter((outcome) => outcome === 'claimed')).toHaveLength(1);
      expect(outcomes.filter((outcome) => outcome === 'busy')).toHaveLength(19);
    });

    it('counts each of 10 groups completing concurrently once', async () => {
      const instances = [ledger, await peer()];
      const completions = await Promise.all(
        Array.from({ length: 10 }, (_, index) =>
          instances[index % 2].complete(otherGroup(`group-${index}`), 'a', t0 + RETAIN_MS, t0),
        ),
      );
      expect(completions.map((completion) => completion.groups).sort((a, b) => a - b)).toEqual(
        Array.from({ length: 10 }, (_, index) => index + 1),
      );
      expect(completions.every((completion) => completion.first)).toBe(true);
    });

    it.each([
      ['an empty ticket', () => ledger.claim({ ...key, ticket: '' }, 'a', LEASE_MS, t0)],
      ['an empty group', () => ledger.claim({ ...key, group: '' }, 'a', LEASE_MS, t0)],
      ['an empty holder', () => ledger.claim(key, '', LEASE_MS, t0)],
      ['a lease of 0 ms', () => ledger.claim(key, 'a', 0, t0)],
      ['a fractional time', () => ledger.claim(key, 'a', LEASE_MS, t0 + 0.5)],
      ['retainUntil not after now', () => ledger.complete(key, 'a', t0, t0)],
      ['an empty holder releasing', () => ledger.release(key, '')],
    ])('rejects %s with a RangeError', async (_case, call) => {
      await expect(call()).rejects.toThrow(RangeError);
    });
  });
}
