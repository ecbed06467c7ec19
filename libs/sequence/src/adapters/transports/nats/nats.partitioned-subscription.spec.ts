import { Logger } from '@nestjs/common';
import type { NatsPartitionLeases } from './nats.partition-leases';
import { NatsPartitionedSubscription } from './nats.partitioned-subscription';
import type { NatsSubscription } from './nats.subscription';
import { partitionAckWaitMs } from './nats.topology';

const LEASE_MS = 10_000;
const ACK_WAIT_MS = partitionAckWaitMs(30_000, LEASE_MS);

/** A write's round trip to the server. */
const ROUND_TRIP_MS = 50;

/**
 * Leases that the server stores: every write of partition 0 answered after a round trip; a claim
 * of any other partition answered "held by another" after `otherClaimMs`.
 */
function leasesOfPartitionZero(otherClaimMs: number): {
  leases: NatsPartitionLeases;
  renewals: number[];
} {
  let sequence = 0;
  const renewals: number[] = [];
  const answer = <T>(value: () => T, ms: number) =>
    new Promise<T>((resolve) => setTimeout(() => resolve(value()), ms));
  const leases = {
    claim: (index: number) =>
      index === 0 ? answer(() => ++sequence, ROUND_TRIP_MS) : answer(() => undefined, otherClaimMs),
    renew: () => {
      renewals.push(Date.now());
      return answer(() => ++sequence, ROUND_TRIP_MS);
    },
    release: async () => undefined,
    held: async () => new Set<number>(),
    onReleased: () => () => undefined,
  } as unknown as NatsPartitionLeases;
  return { leases, renewals };
}

/**
 * A subscription of one partition over `leases`, its lease `leaseMs`, recording each partition it
 * opens: whether it may still hold it, and whether it was abandoned.
 */
function onePartitionRecorded(
  leases: NatsPartitionLeases,
  leaseMs: number,
): {
  subscription: NatsPartitionedSubscription;
  opened: Array<{ mayHold: () => boolean; abandoned: boolean }>;
} {
  const opened: Array<{ mayHold: () => boolean; abandoned: boolean }> = [];
  const subscription = new NatsPartitionedSubscription({
    channel: 'orders',
    count: 1,
    ensure: async () => leaseMs,
    forget: () => undefined,
    leases,
    open: (_index, mayHold) => {
      const partition = { mayHold, abandoned: false };
      opened.push(partition);
      return {
        close: async () => undefined,
        abandon: async () => void (partition.abandoned = true),
      } as unknown as NatsSubscription;
    },
    logger: new Logger('nats.partitioned-subscription.spec'),
    onClosed: () => undefined,
  });
  return { subscription, opened };
}

describe('NatsPartitionedSubscription', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it.each([
    ['every claim answered at once', 1, ROUND_TRIP_MS],
    ["another partition's claim answered only after 60% of the lease", 2, 0.6 * LEASE_MS],
  ])(
    'renews a held lease before in-progress acks would keep its messages past it: %s',
    async (_label, count, otherClaimMs) => {
      const { leases, renewals } = leasesOfPartitionZero(otherClaimMs);
      let mayExtend: ((ackWaitMs: number) => boolean) | undefined;
      const subscription = new NatsPartitionedSubscription({
        channel: 'orders',
        count,
        ensure: async () => LEASE_MS,
        forget: () => undefined,
        leases,
        open: (index, _mayHold, extend) => {
          if (index === 0) mayExtend = extend;
          return {
            close: async () => undefined,
            abandon: async () => undefined,
          } as NatsSubscription;
        },
        logger: new Logger('nats.partitioned-subscription.spec'),
        onClosed: () => undefined,
      });
      const started = subscription.start();
      await jest.advanceTimersByTimeAsync(otherClaimMs + 2 * ROUND_TRIP_MS);
      await started;
      expect(mayExtend).toBeDefined();

      // While every renewal is stored, the holder may keep its messages in progress at every
      // moment: a pause in its in-progress acks longer than ack_wait would let the server
      // deliver them again while it still holds the lease.
      const closedAt: number[] = [];
      for (let step = 0; step < (5 * LEASE_MS) / 10; step++) {
        await jest.advanceTimersByTimeAsync(10);
        if (!mayExtend!(ACK_WAIT_MS)) closedAt.push(Date.now());
      }

      expect(renewals.length).toBeGreaterThanOrEqual(10);
      expect(closedAt).toEqual([]);
      const closing = subscription.close();
      await jest.advanceTimersByTimeAsync(otherClaimMs + 2 * ROUND_TRIP_MS);
      await closing;
    },
  );

  it('logs a failing claim loop once while renewals go on, and no recovery it did not make', async () => {
    const { leases, renewals } = leasesOfPartitionZero(ROUND_TRIP_MS);
    let claimsFail = false;
    const held = leases.held.bind(leases);
    leases.held = () => (claimsFail ? Promise.reject(new Error('TIMEOUT')) : held());
    const logger = new Logger('nats.partitioned-subscription.spec');
    const warn = jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
    const log = jest.spyOn(logger, 'log').mockImplementation(() => undefined);
    const subscription = new NatsPartitionedSubscription({
      channel: 'orders',
      count: 2,
      ensure: async () => LEASE_MS,
      forget: () => undefined,
      leases,
      open: () =>
        ({ close: async () => undefined, abandon: async () => undefined }) as NatsSubscription,
      logger,
      onClosed: () => undefined,
    });
    const started = subscription.start();
    await jest.advanceTimersByTimeAsync(3 * ROUND_TRIP_MS);
    await started;

    claimsFail = true;
    await jest.advanceTimersByTimeAsync(3 * LEASE_MS);

    expect(renewals.length).toBeGreaterThanOrEqual(6);
    expect(subscription.partitions).toEqual([0]);
    expect(warn.mock.calls.map(([message]) => String(message))).toEqual([
      'partition leases of orders: claims failed: TIMEOUT; trying again',
    ]);
    expect(log).not.toHaveBeenCalled();
    const closing = subscription.close();
    await jest.advanceTimersByTimeAsync(2 * ROUND_TRIP_MS);
    await closing;
  });
  it('abandons its messages at the moment its lease stops being trusted, not at the next fence check', async () => {
    // The fence checks every tenth of the lease time, rounded down to the millisecond: with a
    // lease time that is not a multiple of 10 ms, the trust (90%) ends 8 ms after a check, and
    // the next check is a second away.
    const leaseMs = 10_009;
    let sequence = 0;
    const unanswered: Array<() => void> = [];
    const leases = {
      claim: () => new Promise((resolve) => setTimeout(() => resolve(++sequence), ROUND_TRIP_MS)),
      // The connection is gone: no renewal is answered (until the test closes).
      renew: () => new Promise((resolve) => unanswered.push(() => resolve(++sequence))),
      release: async () => undefined,
      held: async () => new Set<number>(),
      onReleased: () => () => undefined,
    } as unknown as NatsPartitionLeases;
    const { subscription, opened } = onePartitionRecorded(leases, leaseMs);
    const started = subscription.start();
    await jest.advanceTimersByTimeAsync(2 * ROUND_TRIP_MS);
    await started;
    const [partition] = opened;

    await jest.advanceTimersByTimeAsync(0.8 * leaseMs);
    expect(unanswered.length).toBeGreaterThan(0); // renewals were tried, and got no answer
    expect(partition).toMatchObject({ abandoned: false });
    // Millisecond by millisecond, up to the moment the lease is no longer trusted.
    while (partition.mayHold()) {
      expect(partition.abandoned).toBe(false);
      await jest.advanceTimersByTimeAsync(1);
    }
    // Abandoned then, by the timer set to that moment (rounded up to the next millisecond).
    await jest.advanceTimersByTimeAsync(1);
    expect(partition.abandoned).toBe(true);

    for (const answer of unanswered) answer();
    const closing = subscription.close();
    await jest.advanceTimersByTimeAsync(2 * ROUND_TRIP_MS);
    await closing;
  });

  it('does not trust a lease again on a renewal answered after its trust ran out, without letting go first', async () => {
    let sequence = 0;
    let holdAnswers = false;
    const unanswered: Array<() => void> = [];
    const leases = {
      claim: () => new Promise((resolve) => setTimeout(() => resolve(++sequence), ROUND_TRIP_MS)),
      renew: () =>
        new Promise((resolve) => {
          const answer = () => resolve(++sequence);
          if (holdAnswers) unanswered.push(answer);
          else setTimeout(answer, ROUND_TRIP_MS);
        }),
      release: async () => undefined,
      held: async () => new Set<number>(),
      onReleased: () => () => undefined,
    } as unknown as NatsPartitionLeases;
    const { subscription, opened } = onePartitionRecorded(leases, LEASE_MS);
    const started = subscription.start();
    await jest.advanceTimersByTimeAsync(2 * ROUND_TRIP_MS);
    await started;
    expect(opened).toHaveLength(1);

    holdAnswers = true;
    for (let step = 0; step < LEASE_MS / 10 && unanswered.length === 0; step++) {
      await jest.advanceTimersByTimeAsync(10);
    }
    expect(unanswered).toHaveLength(1);
    // The wall clock steps forward (a resumed virtual machine) past the lease's trusted time,
    // which fires neither the distrust timer nor the fence: the lease is not trusted now.
    jest.setSystemTime(Date.now() + 0.65 * LEASE_MS);
    const [first] = opened;
    expect(first.mayHold()).toBe(false);

    unanswered.shift()!();
    await jest.advanceTimersByTimeAsync(0);
    // The late answer does not make the messages held through the gap this subscriber's again.
    expect({ mayHold: first.mayHold(), abandoned: first.abandoned }).toEqual({
      mayHold: false,
      abandoned: true,
    });

    holdAnswers = false;
    const closing = subscription.close();
    await jest.advanceTimersByTimeAsync(2 * ROUND_TRIP_MS);
    await closing;
  });
});
