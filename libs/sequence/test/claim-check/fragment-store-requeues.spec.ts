import { Redis } from 'ioredis';
import { SplitterService } from 'nest-sequence';
import type { PublishOptions } from 'nest-sequence/ports';
import { RedisPayloadStore } from 'nest-sequence/redis';
import { ForwardingTransport } from '../../src/testing/forwarding.transport';
import { parseFragmentHeaders, type ClaimTicket, type HeaderMap } from 'nest-sequence/wire';
import { parseTicketBody } from '../../src/core/claim-ticket';
import { bytes, eventually, metricValue, recordingHandler } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { useRedis } from '../support/redis.fixture';
import { describeWithServer } from '../support/servers';

const READ_TIMEOUT_MS = 300;
const MAX_STORE_REQUEUES = 2;
const SEQUENCED = 'seq.parked';
const SequencedReceiver = recordingHandler({ channel: SEQUENCED });

/**
 * A fragment sent `via: 'claim-check'` whose parked body the payload store never gives back (a
 * stalled read, past `claimCheck.readTimeoutMs`) is requeued as for a store outage, but not for
 * ever: once its message has been requeued `tuning.maxStoreRequeues` times it is dead-lettered
 * `store-unavailable`, naming the last failure, on a `@SequencedHandler` channel as on a
 * `@ClaimCheck` one. The parked body stays in the store for the dead letter to be published again.
 */
describe('claim check: a parked fragment body the store never gives back', () => {
  let t: ClaimCheckTestApp | undefined;
  let store: FaultInjectingPayloadStore;

  async function boot(): Promise<ClaimCheckTestApp> {
    t = await createClaimCheckTestApp({
      claimCheck: { readTimeoutMs: READ_TIMEOUT_MS, inlineMaxBytes: 1024 },
      module: { tuning: { maxStoreRequeues: MAX_STORE_REQUEUES } },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
      providers: [SequencedReceiver],
    });
    return t;
  }
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  /**
   * Sends one fragment via claim check to `channel` whose store never answers a read, and waits
   * until it is dead-lettered, or requeued well past the bound (then the bound did not hold).
   */
  async function sendUnreadable(app: ClaimCheckTestApp, channel: string): Promise<void> {
    store.hangGets = 1_000;
    await app.app.get(SplitterService).send(channel, bytes(4_000, 9), {
      via: 'claim-check',
      fragmentBytes: 64 * 1024,
    });
    await deadLetteredOrPastTheBound(app, channel, MAX_STORE_REQUEUES, READ_TIMEOUT_MS);
  }

  const reasonPattern = new RegExp(
    `^store-unavailable: payload store unavailable after ${MAX_STORE_REQUEUES} requeues of the ` +
      `message .*did not open payload .* within ${READ_TIMEOUT_MS} ms ` +
      '\\(claimCheck\\.readTimeoutMs\\)',
  );

  it.each([
    ['@SequencedHandler', SEQUENCED],
    ['@ClaimCheck', 'cc.test'],
  ])(
    'on a %s channel: requeued maxStoreRequeues times, then dead-lettered store-unavailable naming the timeout, its parked body kept',
    async (_kind, channel) => {
      const app = await boot();
      await sendUnreadable(app, channel);

      expect(app.transport.actionsOn(channel)).toEqual([
        ...Array<string>(MAX_STORE_REQUEUES).fill('requeue'),
        'dead-letter',
      ]);
      expect(deathReasons(app.transport, channel)).toEqual([expect.stringMatching(reasonPattern)]);
      // The dead letter is the fragment's own message: its ticket, its sequence headers.
      const [dead] = app.transport.peek(`${channel}.dlq`);
      expect(parseFragmentHeaders(dead.headers).position).toBe(1);
      const ticket = parseTicketBody(dead.body) as ClaimTicket;
      // Kept for the dead letter to be published again once the store answers.
      expect(await app.store.head(ticket.ref)).toMatchObject({ bytes: 4_000 });
      expect(app.app.get(SequencedReceiver).calls).toBe(0);
      expect(app.handler.calls).toBe(0);
      // Counted as a refused fragment, as the channel's other refused fragments are.
      const labels = { channel, reason: 'store-unavailable' };
      expect(
        await metricValue(app.registry, 'nest_sequence_fragments_rejected_total', labels),
      ).toBe(1);
    },
  );

  it('on a @SequencedHandler channel: a store that answers again within the bound delivers the sequence', async () => {
    const app = await boot();
    store.hangGets = MAX_STORE_REQUEUES;
    const payload = bytes(4_000, 11);
    await app.app.get(SplitterService).send(SEQUENCED, payload, {
      via: 'claim-check',
      fragmentBytes: 64 * 1024,
    });
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(SEQUENCED)).toEqual([
      ...Array<string>(MAX_STORE_REQUEUES).fill('requeue'),
      'ack',
    ]);
    const receiver = app.app.get(SequencedReceiver);
    expect(receiver.deliveries).toHaveLength(1);
    expect(receiver.deliveries[0].bytes.equals(payload)).toBe(true);
  });
});

/**
 * The same against a real store: a RedisPayloadStore whose connection to the real Redis goes
 * through a proxy that freezes once the fragment is parked (the server stops answering; nothing is
 * refused or reset, and ioredis has no command timeout of its own).
 */
/**
 * Waits until the message on `channel` is dead-lettered, or requeued well past `maxStoreRequeues`
 * (then the bound did not hold: the actions show how far past it).
 */
async function deadLetteredOrPastTheBound(
  app: ClaimCheckTestApp,
  channel: string,
  maxStoreRequeues: number,
  readTimeoutMs: number,
): Promise<void> {
  const requeuesPastTheBound = maxStoreRequeues + 4;
  await eventually(
    () =>
      app.transport.actionsOn(channel).includes('dead-letter') ||
      app.transport.actionsOn(channel).filter((action) => action === 'requeue').length >=
        requeuesPastTheBound,
    `a dead letter or ${requeuesPastTheBound} requeues on ${channel}`,
    (requeuesPastTheBound + 2) * (readTimeoutMs + 200) + 5_000,
  );
  // Not while it is still being requeued: there would be no end to wait for.
  if (app.transport.actionsOn(channel).includes('dead-letter')) await app.transport.whenIdle();
}

/** Confirms the publishes to one channel without delivering them, until `deliver`. */
class WithholdingTransport extends ForwardingTransport {
  readonly name = 'withholding';
  private readonly withheld: Array<{ body: Buffer; headers: HeaderMap }> = [];

  constructor(
    inner: ForwardingTransport['inner'],
    private readonly channel: string,
  ) {
    super(inner);
  }

  override publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    if (channel !== this.channel) return super.publish(channel, body, headers, options);
    this.withheld.push({ body, headers });
    return Promise.resolve();
  }

  async deliver(): Promise<void> {
    for (const { body, headers } of this.withheld.splice(0)) {
      await this.inner.publish(this.channel, body, headers);
    }
  }
}

describeWithServer(
  'redis',
  'claim check: a Redis payload store that stops answering for a parked fragment body',
  () => {
    const redis = useRedis({ stem: 'nseq-test-frag-stall' });
    let proxy: FreezingProxy | undefined;
    let client: Redis | undefined;
    let t: ClaimCheckTestApp | undefined;
    afterEach(async () => {
      await t?.close();
      client?.disconnect();
      await proxy?.close();
      t = client = proxy = undefined;
    });

    it('on a @SequencedHandler channel: requeued once, then dead-lettered store-unavailable naming the timeout', async () => {
      ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
      const store = new RedisPayloadStore(client, { prefix: redis.prefix });
      let withholding: WithholdingTransport | undefined;
      const app = (t = await createClaimCheckTestApp({
        claimCheck: { readTimeoutMs: 200, inlineMaxBytes: 1024 },
        module: { tuning: { maxStoreRequeues: 1 } },
        wrapStore: () => store,
        wrapTransport: (inner) => (withholding = new WithholdingTransport(inner, SEQUENCED)),
        providers: [SequencedReceiver],
      }));
      await app.app
        .get(SplitterService)
        .send(SEQUENCED, bytes(4_000, 5), { via: 'claim-check', fragmentBytes: 64 * 1024 });
      proxy.freeze(); // parked and published: Redis answers nothing more
      await withholding!.deliver();
      await deadLetteredOrPastTheBound(app, SEQUENCED, 1, 200);

      expect(app.transport.actionsOn(SEQUENCED)).toEqual(['requeue', 'dead-letter']);
      expect(deathReasons(app.transport, SEQUENCED)).toEqual([
        expect.stringMatching(
          /^store-unavailable: payload store unavailable after 1 requeues of the message .*the redis payload store did not open payload .* within 200 ms \(claimCheck\.readTimeoutMs\)/,
        ),
      ]);
      expect(app.app.get(SequencedReceiver).calls).toBe(0);
      // Kept in the store for the dead letter to be published again.
      const [dead] = app.transport.peek(`${SEQUENCED}.dlq`);
      const ticket = parseTicketBody(dead.body) as ClaimTicket;
      const direct = new RedisPayloadStore(redis.client, { prefix: redis.prefix });
      expect(await direct.head(ticket.ref)).toMatchObject({ bytes: 4_000 });
    });
  },
);
