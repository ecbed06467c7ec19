import { MemoryClaimLedger } from 'nest-sequence';
import type { ClaimKey, ClaimLedger } from 'nest-sequence/ports';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * While a handler runs, the receiver renews its group's lease on the ticket. A renewal still on
 * its way when the handler fails must not land after the release: it would take the lease again
 * for the finished call, and the ticket's next delivery would find it busy (and be requeued)
 * until that lease lapsed.
 */
describe('claim check: the lease renewal of a call that failed', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t?.close());

  it('lands before the release, so the next delivery finds the ticket free', async () => {
    const memory = new MemoryClaimLedger();
    const answers: string[] = [];
    const holders = new Set<string>();
    // Renewals (a holder's second claim and later) take 200 ms to come back.
    const ledger = new Proxy(memory, {
      get(target, property, receiver): unknown {
        if (property !== 'claim') return Reflect.get(target, property, receiver);
        return async (key: ClaimKey, holder: string, leaseMs: number, now: number) => {
          const renewal = holders.has(holder);
          holders.add(holder);
          if (renewal) await new Promise((resolve) => setTimeout(resolve, 200));
          const outcome = await target.claim(key, holder, leaseMs, renewal ? Date.now() : now);
          answers.push(outcome);
          return outcome;
        };
      },
    }) as ClaimLedger;
    t = await createClaimCheckTestApp({
      handlers: [{ channel: 'cc.test', handlerRetry: { attempts: 1 } }],
      claimCheck: { ledger, deleteAfter: 'ttl' },
      module: { tuning: { leaseMs: 3_000, backpressureDelayMs: 10 } },
    });
    const ticket = await t.claimCheck.checkIn(bytes(10_000, 3), { audience: t.channel });
    // The first call outlives one renewal interval (leaseMs / 3), then fails.
    t.handler.failNext = 1;
    t.handler.onCall = async () => {
      if (t.handler.calls === 1) await new Promise((resolve) => setTimeout(resolve, 1_100));
    };

    await publishTicket(t.transport, t.channel, ticket);
    await eventually(() => t.handler.calls === 1 && answers.length >= 2, 'the call and a renewal');
    await t.transport.whenIdle();
    await new Promise((resolve) => setTimeout(resolve, 300)); // a late renewal would be in now
    // The ticket again (a duplicate, or a republish after the failure).
    await publishTicket(t.transport, t.channel, ticket);
    await eventually(() => t.handler.deliveries.length === 1, 'the second delivery handled', 2_000);

    expect(answers).not.toContain('busy');
  });

  it('does not wait for ever for a renewal that never answers: the handled ticket is acked', async () => {
    const memory = new MemoryClaimLedger();
    const holders = new Set<string>();
    // Renewals never answer (a lost reply, and no command timeout).
    const ledger = new Proxy(memory, {
      get(target, property, receiver): unknown {
        if (property !== 'claim') return Reflect.get(target, property, receiver);
        return (key: ClaimKey, holder: string, leaseMs: number, now: number) => {
          const renewal = holders.has(holder);
          holders.add(holder);
          if (renewal) return new Promise(() => undefined);
          return target.claim(key, holder, leaseMs, now);
        };
      },
    }) as ClaimLedger;
    t = await createClaimCheckTestApp({
      handlers: [{ channel: 'cc.test', handlerRetry: { attempts: 1 } }],
      claimCheck: { ledger, deleteAfter: 'ttl' },
      module: { tuning: { leaseMs: 600, backpressureDelayMs: 10 } },
    });
    const ticket = await t.claimCheck.checkIn(bytes(1_000, 3), { audience: t.channel });
    // Outlives one renewal interval (leaseMs / 3).
    t.handler.onCall = () => new Promise((resolve) => setTimeout(resolve, 300));

    await publishTicket(t.transport, t.channel, ticket);
    await eventually(() => t.handler.deliveries.length === 1, 'handled');

    // Within the lease's time after the call, not never.
    await eventually(() => t.transport.actionsOn(t.channel).length === 1, 'settled', 3_000);
    expect(t.transport.actionsOn(t.channel)).toEqual(['ack']);
  });
});

/**
 * The lease is renewed from the claim on: a store slow to answer before the handler starts (its
 * `head`) must not let the lease lapse, and a copy of the ticket be handled as well.
 */
describe('claim check: the lease before the handler starts', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t?.close());

  it('runs the handler once for two copies of a ticket when the store is slow to answer', async () => {
    let heads = 0;
    t = await createClaimCheckTestApp({
      handlers: [{ channel: 'cc.test', handlerRetry: { attempts: 1 } }],
      claimCheck: { ledger: new MemoryClaimLedger(), deleteAfter: 'ttl' },
      module: { tuning: { leaseMs: 300, backpressureDelayMs: 10 } },
      wrapStore: (store) =>
        new Proxy(store, {
          get(target, property, receiver): unknown {
            if (property !== 'head') return Reflect.get(target, property, receiver);
            return async (ref: string) => {
              // The first head outlasts the lease (300 ms).
              if (++heads === 1) await new Promise((resolve) => setTimeout(resolve, 500));
              return target.head(ref);
            };
          },
        }),
    });
    const ticket = await t.claimCheck.checkIn(bytes(1_000, 3), { audience: t.channel });
    t.handler.onCall = () => new Promise((resolve) => setTimeout(resolve, 200));

    await publishTicket(t.transport, t.channel, ticket);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await publishTicket(t.transport, t.channel, ticket); // a copy: a publisher's retry
    await eventually(() => t.handler.deliveries.length >= 1, 'handled');
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.transport.actionsOn(t.channel).filter((action) => action === 'ack')).toHaveLength(2);
  });
});
