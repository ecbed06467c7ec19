import { Injectable } from '@nestjs/common';
import { Redis } from 'ioredis';
import { type ReassembledPayload, SequencedHandler } from 'nest-sequence';
import { SequenceStoreTimeoutError } from 'nest-sequence/ports';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { SettlementRecordingTransport } from '../claim-check/claim-check-test-app';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { useRedis } from '../support/redis.fixture';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';

const LEASE_MS = 300;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The proxy the current test's store talks through (the handler below freezes it). */
let proxy: FreezingProxy | undefined;

const RENEWAL_CHANNEL = 'guarantees.stalled-store.renewal';

/**
 * A handler that has read its payload when the store stops answering, and goes on working for
 * two leases, heedless of its signal: every renewal of its lease meanwhile goes unanswered, so
 * the lease counts as lost and the call is abandoned.
 */
@Injectable()
class WorksOnWhileFrozen {
  readonly received: Buffer[] = [];
  calls = 0;
  running = 0;
  overlapped = false;

  @SequencedHandler({ channel: RENEWAL_CHANNEL })
  async handle(payload: ReassembledPayload): Promise<void> {
    this.calls++;
    this.running++;
    this.overlapped ||= this.running > 1;
    try {
      const body = await payload.toBuffer();
      if (this.calls === 1) {
        proxy!.freeze();
        await sleep(2 * LEASE_MS);
      }
      this.received.push(body);
    } finally {
      this.running--;
    }
  }
}

/**
 * Message Sequence: a store that stops answering (a frozen Redis, a network black hole: the
 * connection stays open, nothing is refused) must hold neither a fragment message, and its
 * prefetch slot, nor a delivery for ever. Each store step is given up on after
 * `tuning.storeTimeoutMs` (a read for each next chunk): the fragment is requeued as
 * for a store outage, and once the store answers again the sequence is delivered, byte-exact.
 */
describeWithServer('redis', 'guarantees: a Redis sequence store that never answers', () => {
  let t: SequenceTestApp | undefined;
  let client: Redis | undefined;
  const redis = useRedis({
    stem: 'nseq-seq-stalled',
    beforeCleanup: async () => {
      proxy?.resume();
      await t?.close();
      t = undefined;
      client?.disconnect();
      await proxy?.close();
      proxy = undefined;
    },
  });
  let transport: SettlementRecordingTransport;

  async function boot(
    channel: string,
    providers = [] as Array<typeof WorksOnWhileFrozen>,
    leaseMs = LEASE_MS,
  ) {
    ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
    // One body in flight at a time: a read that the store stops answering mid-way stalls on the
    // next one.
    const store = new RedisSequenceStore(client, { prefix: redis.prefix, readAhead: 1 });
    transport = new SettlementRecordingTransport();
    t = await createSequenceTestApp(channel, {
      transport,
      sequence: { store },
      tuning: { leaseMs, storeTimeoutMs: LEASE_MS, backpressureDelayMs: 50 },
      providers,
    });
    return t;
  }

  /** The sequence's state in Redis, asked directly (not through the proxy). */
  async function finishedOn(channel: string, sequenceId: string): Promise<string | undefined> {
    const direct = new RedisSequenceStore(redis.client, { prefix: redis.prefix });
    const status = await direct.status({ scope: channel, sequenceId }, Date.now());
    return status.state === 'finished' ? status.outcome : undefined;
  }

  it('an accept that never answers: the fragment is requeued after storeTimeoutMs, and the sequence delivered once the store answers', async () => {
    const channel = 'guarantees.stalled-store.accept';
    const app = await boot(channel);
    const payload = bytes(4_000, 31);
    const fragments = makeFragments('stalled-accept', payload, 1_000);
    await publishAll(transport, channel, fragments.slice(0, 3));
    await eventually(
      () => transport.actionsOn(channel).filter((action) => action === 'ack').length === 3,
      'the first 3 fragments stored',
    );

    proxy!.freeze();
    await publishAll(transport, channel, fragments.slice(3));
    await eventually(
      () => transport.actionsOn(channel).includes('requeue'),
      'the last fragment requeued while the store does not answer',
      4_000,
    );
    expect(app.handler.calls).toBe(0);

    proxy!.resume();
    await eventually(() => app.handler.deliveries.length === 1, 'the sequence delivered', 10_000);
    await eventually(
      async () => (await finishedOn(channel, 'stalled-accept')) === 'completed',
      'the sequence marked completed',
    );
    await transport.whenIdle();
    await sleep(2 * LEASE_MS);
    expect(app.handler.calls).toBe(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(transport.actionsOn(channel).at(-1)).toBe('ack');
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it('a read that stops mid-way: the handler stream fails with SequenceStoreTimeoutError, and the sequence is delivered once the store answers', async () => {
    const channel = 'guarantees.stalled-store.read';
    // A lease longer than the read's timeout: the read is given up on before the silent store
    // could count as having let the lease lapse (which would stop the handler first).
    const app = await boot(channel, [], 3 * LEASE_MS);
    const payload = bytes(8_000, 32);
    const fragments = makeFragments('stalled-read', payload, 1_000);
    let readError: unknown;
    app.handler.onCall = async (delivered) => {
      if (app.handler.calls > 1) return;
      let chunks = 0;
      try {
        for await (const _chunk of delivered.stream()) {
          if (++chunks === 1) proxy!.freeze();
        }
      } catch (error) {
        readError = error;
        throw error;
      }
    };
    await publishAll(transport, channel, fragments);

    await eventually(() => readError !== undefined, 'the stalled read failed', 4_000);
    expect(readError).toBeInstanceOf(SequenceStoreTimeoutError);
    expect(readError).toMatchObject({ call: 'read', subject: `${channel}/stalled-read` });
    await eventually(
      () => transport.actionsOn(channel).includes('requeue'),
      'the completing fragment requeued, not held',
      4_000,
    );
    expect(app.handler.deliveries).toHaveLength(0);

    proxy!.resume();
    await eventually(() => app.handler.deliveries.length === 1, 'the sequence delivered', 10_000);
    await eventually(
      async () => (await finishedOn(channel, 'stalled-read')) === 'completed',
      'the sequence marked completed',
    );
    await transport.whenIdle();
    await sleep(2 * LEASE_MS);
    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it('renewals that never answer while the handler works: the call is asked to stop, the delivery requeued, not held, and the sequence completed once the store answers', async () => {
    const app = await boot('guarantees.stalled-store.unused', [WorksOnWhileFrozen]);
    const handler = app.app.get(WorksOnWhileFrozen);
    const payload = bytes(4_000, 33);
    await publishAll(transport, RENEWAL_CHANNEL, makeFragments('stalled-renewal', payload, 1_000));

    await eventually(
      () => transport.actionsOn(RENEWAL_CHANNEL).includes('requeue'),
      'the completing fragment requeued once its lease was lost',
      6_000,
    );
    expect(handler.received).toHaveLength(1);

    proxy!.resume();
    await eventually(
      async () => (await finishedOn(RENEWAL_CHANNEL, 'stalled-renewal')) === 'completed',
      'the sequence marked completed',
      10_000,
    );
    await transport.whenIdle();
    // The outcome never reached the store: the handler may have run again (at least once), never
    // on other bytes, and never alongside itself.
    expect(handler.calls).toBeGreaterThanOrEqual(1);
    expect(handler.calls).toBeLessThanOrEqual(2);
    for (const body of handler.received) expect(body.equals(payload)).toBe(true);
    expect(handler.overlapped).toBe(false);
    expect(transport.actionsOn(RENEWAL_CHANNEL).at(-1)).toBe('ack');
    expect(deadLetters(transport, RENEWAL_CHANNEL)).toHaveLength(0);
  });
});
