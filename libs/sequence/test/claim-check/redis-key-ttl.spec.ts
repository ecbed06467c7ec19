import type { Redis } from 'ioredis';
import { SequenceOptionsError } from 'nest-sequence';
import { redis as redisStores, RedisPayloadStore } from 'nest-sequence/redis';
import { EncryptingPayloadStore } from '../../src/adapters/payload/encrypting/encrypting.payload-store';
import type { ClaimCheckOptions } from '../../src/options/claim-check.options';
import type { SequenceModuleOptions } from '../../src/options/module-options';
import { newPrefix, redisClient } from '../support/redis.fixture';
import { describeWithServer } from '../support/servers';
import { createClaimCheckTestApp } from './claim-check-test-app';

const KEY = { id: 'k1', key: Buffer.alloc(32, 7) };

/**
 * The Redis payload store expires a payload's keys `keyTtlMarginMs` after its ticket's expiry,
 * whoever is still reading it; the sweeper leaves a handler that accepted the ticket just before
 * its expiry `claimCheck.expiredGraceMs`. A margin shorter than that grace would pull the
 * payload from under such a handler (`claim-check-not-found` mid-read): the module refuses the
 * pair at boot, wherever the store comes from.
 */
describeWithServer('redis', 'claim check: Redis payload keys outlive expiredGraceMs', () => {
  let client: Redis;
  beforeAll(() => {
    client = redisClient();
  });
  afterAll(async () => {
    await client.quit();
  });

  const payloadStore = (keyTtlMarginMs: number) =>
    new RedisPayloadStore(client, { prefix: newPrefix('nseq-cc-ttl'), keyTtlMarginMs });

  /** Boots an app and returns why it did not start, or undefined when it did. */
  async function bootFailure(
    claimCheck: ClaimCheckOptions,
    module?: Omit<SequenceModuleOptions, 'transport' | 'claimCheck'>,
  ): Promise<SequenceOptionsError | undefined> {
    return createClaimCheckTestApp({ claimCheck, module }).then(
      async (t) => {
        await t.close();
        return undefined;
      },
      (rejection: unknown) => {
        expect(rejection).toBeInstanceOf(SequenceOptionsError);
        return rejection as SequenceOptionsError;
      },
    );
  }

  const PROBLEM =
    /^claimCheck\.expiredGraceMs \(300000\) is longer than the "redis" payload store keeps an expired payload \(60000 ms/;

  it('a keyTtlMarginMs below the default expiredGraceMs: refused, naming both', async () => {
    const error = await bootFailure({ store: payloadStore(60_000) });
    expect(error?.problems).toEqual([expect.stringMatching(PROBLEM)]);
    expect(error?.problems[0]).toMatch(/keyTtlMarginMs of at least 300000/);
  });

  it('a read store, or one wrapped for encryption, is held to it too', async () => {
    const asReadStore = await bootFailure({ readStores: [payloadStore(60_000)] });
    expect(asReadStore?.problems).toEqual([expect.stringMatching(PROBLEM)]);
    const encryptedByTheModule = await bootFailure({
      store: payloadStore(60_000),
      encryption: { keys: [KEY] },
    });
    expect(encryptedByTheModule?.problems).toEqual([expect.stringMatching(PROBLEM)]);
    const wrappedByHand = await bootFailure({
      store: new EncryptingPayloadStore(payloadStore(60_000), { keys: [KEY] }),
    });
    expect(wrappedByHand?.problems).toEqual([expect.stringMatching(PROBLEM)]);
  });

  it("the redis() preset's payload store: refused, until the grace fits its margin", async () => {
    const stores = () => redisStores(client, { payloadStore: { keyTtlMarginMs: 60_000 } });
    const error = await bootFailure({ store: undefined }, { stores: stores() });
    expect(error?.problems).toEqual([expect.stringMatching(PROBLEM)]);
    await expect(
      bootFailure({ store: undefined, expiredGraceMs: 60_000 }, { stores: stores() }),
    ).resolves.toBeUndefined();
  });

  it('a margin equal to the grace, or above it, boots; so do the defaults', async () => {
    await expect(
      bootFailure({ store: payloadStore(120_000), expiredGraceMs: 120_000 }),
    ).resolves.toBeUndefined();
    await expect(
      bootFailure({ store: payloadStore(120_001), expiredGraceMs: 120_000 }),
    ).resolves.toBeUndefined();
    await expect(
      bootFailure({ store: undefined }, { stores: redisStores(client) }),
    ).resolves.toBeUndefined();
  });
});
