/**
 * docs/configuration.md "Clocks": a machine whose clock is off cannot run a Claim Check handler a
 * second time. The receiver retains a completion until the ticket's expiresAt and checks a
 * ticket's expiry on the instance's own clock, while the ledger moves a `now` more than 1 s off
 * onto Redis's clock. An instance whose clock is behind still takes the ticket for valid: its
 * claim must still meet the completion ('done'), not find it past ('claimed': handled twice); nor
 * may an instance whose clock is ahead record a completion that ends before the ticket expired.
 */
import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { describeWithServer } from '../../../../test/support/servers';
import { deleteUnder, redisClient } from '../../../../test/support/redis.fixture';
import { RedisClaimLedger } from './redis.claim-ledger';

describeWithServer('redis', 'RedisClaimLedger: a retained completion and a clock off', () => {
  let client: Redis;
  let prefix: string;

  beforeAll(() => {
    client = redisClient();
  });
  afterAll(async () => {
    await client.quit();
  });
  beforeEach(() => {
    prefix = `nseq-test-claim-clock:${randomUUID()}`;
  });
  afterEach(async () => {
    await deleteUnder(client, prefix);
  });

  /** An in-sync ledger, and one on a machine whose clock runs `behindMs` behind. */
  function ledgers(behindMs: number) {
    const behindClock = () => Date.now() - behindMs;
    return {
      inSync: new RedisClaimLedger(client, { prefix }),
      behind: new RedisClaimLedger(client, { prefix, clock: behindClock }),
      behindClock,
    };
  }

  it('answers done to an instance whose clock is behind, while by its clock the retention runs', async () => {
    const { inSync, behind, behindClock } = ledgers(60_000);
    const key = { ticket: `redis:${randomUUID()}`, group: 'archive' };

    const t0 = Date.now();
    // What the receiver does: retainUntil = max(ticket.expiresAt, now + 1); the ticket expires soon.
    const expiresAt = t0 + 500;
    expect(await inSync.claim(key, 'a', 30_000, t0)).toBe('claimed');
    expect((await inSync.complete(key, 'a', expiresAt, t0)).first).toBe(true);

    await new Promise((resolve) => setTimeout(resolve, 1_000));

    // The late duplicate reaches the instance whose clock is a minute behind: by that clock the
    // ticket has not expired (verifyTicket: expiresAt <= now fails), so it asks the ledger.
    const now = behindClock();
    expect(expiresAt > now).toBe(true);
    await expect(behind.claim(key, 'b', 30_000, now)).resolves.toBe('done');
  });

  it("answers done to an instance behind after another group's complete ran on the ticket", async () => {
    const { inSync, behind, behindClock } = ledgers(60_000);
    const ticket = `redis:${randomUUID()}`;
    const a = { ticket, group: 'archive' };
    const b = { ticket, group: 'index' };

    const t0 = Date.now();
    const expiresAt = t0 + 500;
    expect(await inSync.claim(a, 'a1', 30_000, t0)).toBe('claimed');
    await inSync.complete(a, 'a1', expiresAt, t0);
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    // Another consumer group of the same ticket completes now (an in-sync instance).
    expect(await inSync.claim(b, 'b1', 30_000, Date.now())).toBe('claimed');
    await inSync.complete(b, 'b1', expiresAt + 60_000, Date.now());

    // The duplicate of group archive reaches the instance a minute behind: ticket still valid there.
    const now = behindClock();
    expect(expiresAt > now).toBe(true);
    await expect(behind.claim(a, 'a2', 30_000, now)).resolves.toBe('done');
  });

  it('answers done to an instance behind after an in-sync instance claimed an expired copy', async () => {
    const { inSync, behind, behindClock } = ledgers(30_000);
    const key = { ticket: `redis:${randomUUID()}`, group: 'archive' };

    const t0 = Date.now();
    const expiresAt = t0 + 500;
    expect(await inSync.claim(key, 'a1', 30_000, t0)).toBe('claimed');
    await inSync.complete(key, 'a1', expiresAt, t0);
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    // An in-sync instance meets an expired copy and asks the ledger (the receiver's expiredCopy):
    // past the retention on its clock, the completion is not its answer, but must stay.
    expect(await inSync.claim(key, 'a2', 30_000, Date.now())).toBe('claimed');
    await inSync.release(key, 'a2');

    const now = behindClock();
    expect(expiresAt > now).toBe(true);
    await expect(behind.claim(key, 'a3', 30_000, now)).resolves.toBe('done');
  });

  it('keeps a completion recorded by an instance whose clock is ahead until the ticket expired', async () => {
    // The completion's retainUntil comes from the ticket (its expiresAt, on the sender's clock),
    // not from the completing instance's clock: moving it onto Redis's clock by that instance's
    // offset would end the retention early, and an in-sync instance, for which the ticket is
    // still valid, would handle its duplicate a second time.
    const aheadMs = 10_000;
    const inSync = new RedisClaimLedger(client, { prefix });
    const aheadClock = () => Date.now() + aheadMs;
    const ahead = new RedisClaimLedger(client, { prefix, clock: aheadClock });
    const key = { ticket: `redis:${randomUUID()}`, group: 'archive' };

    const t0 = Date.now();
    // The ticket expires 30 s from now on every correct clock (20 s by the instance ahead).
    const expiresAt = t0 + 30_000;
    expect(await ahead.claim(key, 'a', 30_000, aheadClock())).toBe('claimed');
    expect((await ahead.complete(key, 'a', expiresAt, aheadClock())).first).toBe(true);

    // A duplicate reaches an in-sync instance 25 s on (its `now` passed as is): the ticket is
    // still valid there, so the claim must meet the completion.
    const now = t0 + 25_000;
    expect(expiresAt > now).toBe(true);
    await expect(inSync.claim(key, 'b', 30_000, now)).resolves.toBe('done');
  });
});
