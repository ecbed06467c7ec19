import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import {
  ClaimCheck,
  ClaimCheckService,
  ClaimedPayload,
  FilesystemPayloadStore,
  InMemoryTransport,
  MemorySequenceStore,
  SequenceModule,
  SequencedHandler,
  SequenceSourceError,
  SplitterService,
  type ReassembledPayload,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { ExpirySweeper } from '../../src/sequence/expiry.sweeper';
import { parseFragmentHeaders, type HeaderMap } from 'nest-sequence/wire';
import { recordEvents } from '../events/event-recorder';
import { InstrumentedStore } from '../guarantees/instrumented.sequence-store';
import { bytes, makeFragments } from '../support/sequence-test-app';
import { createClaimCheckTestApp } from './claim-check-test-app';
import { deadLetters, deathReasonOf, eventually } from '../support/sequence-test-app';

/** An in-memory transport that remembers every message published to it. */
class MeasuringTransport extends InMemoryTransport {
  readonly published: Array<{ channel: string; bytes: number; body: Buffer; headers: HeaderMap }> =
    [];

  /** Messages it confirms but does not deliver (until `deliverWithheld`). */
  withhold?: (headers: HeaderMap) => boolean;
  private readonly withheld: Array<{ channel: string; body: Buffer; headers: HeaderMap }> = [];

  override publish(channel: string, body: Buffer, headers: HeaderMap, options?: object) {
    this.published.push({ channel, bytes: body.length, body, headers });
    if (this.withhold?.(headers)) {
      this.withheld.push({ channel, body, headers });
      return Promise.resolve();
    }
    return super.publish(channel, body, headers, options);
  }

  async deliverWithheld(): Promise<void> {
    this.withhold = undefined;
    for (const { channel, body, headers } of this.withheld.splice(0)) {
      await this.publish(channel, body, headers);
    }
  }
}

const AUTO = 'cc.auto';
const HYBRID = 'cc.hybrid';

@Injectable()
class Receivers {
  readonly claimed: Array<{ via: string; bytes: Buffer; headers: HeaderMap }> = [];
  readonly reassembled: Buffer[] = [];
  /** Holds each call of onHybrid until it resolves. */
  gate?: Promise<void>;
  calls = 0;

  @ClaimCheck({ channel: AUTO })
  async onAuto(payload: ClaimedPayload): Promise<void> {
    this.claimed.push({
      via: payload.via,
      bytes: await payload.toBuffer(),
      headers: payload.headers,
    });
  }

  @SequencedHandler({ channel: HYBRID })
  async onHybrid(payload: ReassembledPayload): Promise<void> {
    this.calls++;
    await this.gate;
    this.reassembled.push(await payload.toBuffer());
  }
}

/** An application of `options` with the `Receivers` handlers. */
async function bootReceivers(options: SequenceModuleOptions): Promise<INestApplicationContext> {
  const moduleRef = await Test.createTestingModule({
    imports: [SequenceModule.forRoot(options)],
    providers: [Receivers],
  }).compile();
  moduleRef.useLogger(false);
  return moduleRef.init();
}

/**
 * `mode: 'auto'` (inline, a sequence or a ticket by size, one @ClaimCheck handler for all three)
 * and `send(..., { via: 'claim-check' })` (fragments parked, tickets on the broker).
 */
describe('claim check: mode auto and fragments via claim check', () => {
  let app: INestApplicationContext;
  let root: string;
  let transport: MeasuringTransport;
  let receivers: Receivers;

  let sequenceStore: InstrumentedStore;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'cc-auto-'));
    transport = new MeasuringTransport();
    sequenceStore = new InstrumentedStore(new MemorySequenceStore());
    app = await bootReceivers({
      transport,
      claimCheck: {
        store: new FilesystemPayloadStore({ root }),
        sequenceMaxBytes: 1024 * 1024,
        inlineMaxBytes: 16 * 1024,
        // Shorter than the sequence store's retention (1 h): a late copy can outlive its ticket.
        ttlMs: 60_000,
      },
      tuning: {
        sweepers: { orphans: { intervalMs: false }, expiry: { intervalMs: false } },
        // Longer than the clock is moved on below: a handler at work keeps its lease.
        leaseMs: 600_000,
        backpressureDelayMs: 10,
      },
      sequence: { store: sequenceStore, fragmentBytes: 64 * 1024 },
    });
    receivers = app.get(Receivers);
  });

  afterEach(async () => {
    await app.close();
    await rm(root, { recursive: true, force: true });
  });

  const payloadFiles = async () =>
    (await readdir(root, { recursive: true, withFileTypes: true })).filter((entry) =>
      entry.isFile(),
    );

  it('sends small payloads inline, mid-sized ones as a sequence and large ones as a ticket; one handler gets all three', async () => {
    const claimCheck = app.get(ClaimCheckService);
    const small = randomBytes(16 * 1024);
    const mid = randomBytes(300 * 1024);
    const large = randomBytes(1024 * 1024 + 1);

    const receipts = [
      await claimCheck.publish(AUTO, small, { mode: 'auto', headers: { study: 's' } }),
      await claimCheck.publish(AUTO, mid, { mode: 'auto', headers: { study: 'm' } }),
      await claimCheck.publish(AUTO, large, { mode: 'auto', headers: { study: 'l' } }),
    ];
    await transport.whenIdle();

    expect(receipts.map((r) => r.via)).toEqual(['inline', 'sequence', 'ticket']);
    const byStudy = (study: string) => receivers.claimed.find((c) => c.headers.study === study);
    expect(byStudy('s')).toMatchObject({ via: 'inline' });
    expect(byStudy('m')).toMatchObject({ via: 'sequence' });
    expect(byStudy('l')).toMatchObject({ via: 'ticket' });
    expect(byStudy('s')?.bytes.equals(small)).toBe(true);
    expect(byStudy('m')?.bytes.equals(mid)).toBe(true);
    expect(byStudy('l')?.bytes.equals(large)).toBe(true);
    // The sequence went as 5 fragments of at most 64 KiB; the large payload as one small ticket.
    const onAuto = transport.published.filter((m) => m.channel === AUTO);
    expect(onAuto.filter((m) => m.headers['x-sequence-id'] !== undefined)).toHaveLength(5);
    expect(Math.max(...onAuto.map((m) => m.bytes))).toBeLessThanOrEqual(64 * 1024);
    // The ticket's payload is deleted after the ack (in the background: the ack does not wait).
    await eventually(async () => (await payloadFiles()).length === 0, 'the payload deleted');
    expect(deadLetters(transport, AUTO)).toHaveLength(0);
  });

  it('sends a stream of unknown size above the threshold as a ticket, and as a sequence when told its size', async () => {
    const claimCheck = app.get(ClaimCheckService);
    const bytes = randomBytes(200 * 1024);
    const chunks = () => Readable.from([bytes.subarray(0, 70_000), bytes.subarray(70_000)]);

    const unknown = await claimCheck.publish(AUTO, chunks(), { mode: 'auto' });
    const told = await claimCheck.publish(AUTO, chunks(), { mode: 'auto', bytes: bytes.length });
    await transport.whenIdle();

    expect([unknown.via, told.via]).toEqual(['ticket', 'sequence']);
    expect(receivers.claimed.map((c) => c.bytes.equals(bytes))).toEqual([true, true]);
  });

  it.each([
    ['a stream longer than', () => Readable.from([randomBytes(100_000), randomBytes(200_000)])],
    ['a stream shorter than', () => Readable.from([randomBytes(50_000)])],
    ['records longer than', () => ({ records: [randomBytes(100_000), randomBytes(200_000)] })],
  ])(
    'refuses %s its declared bytes, which chose a sequence, and delivers nothing of it',
    async (_, payload) => {
      const claimCheck = app.get(ClaimCheckService);

      const error = await claimCheck
        .publish(AUTO, payload(), { mode: 'auto', bytes: 100_000 })
        .catch((caught: unknown) => caught);
      await transport.whenIdle();

      expect(error).toBeInstanceOf(SequenceSourceError);
      expect((error as Error).message).toMatch(/declared/);
      // The last fragment never went: the consumer holds an incomplete sequence, to expire.
      const sent = transport.published.filter((m) => m.channel === AUTO);
      expect(sent.some((m) => m.headers['x-sequence-last'] === true)).toBe(false);
      expect(sent.reduce((total, m) => total + m.bytes, 0)).toBeLessThanOrEqual(100_000);
      expect(receivers.claimed).toEqual([]);
    },
  );

  it('refuses an object-mode stream with a TypeError without reading it whole', async () => {
    let pulled = 0;
    function* rows() {
      for (let row = 0; row < 50_000; row++) {
        pulled += 1;
        yield { row };
      }
    }
    const source = Readable.from(rows());

    const error = await app
      .get(ClaimCheckService)
      .publish(AUTO, source, { mode: 'auto' })
      .catch((caught: unknown) => caught);

    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toMatch(/object-mode stream/);
    expect(pulled).toBeLessThan(100);
    expect(source.destroyed).toBe(true);
    expect(transport.published.filter((m) => m.channel === AUTO)).toEqual([]);
  });

  it('parks every fragment sent via claim check and puts only small tickets on the broker; the handler gets the payload and the parked bodies are deleted', async () => {
    const payload = randomBytes(600 * 1024);

    const receipt = await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();

    expect(receipt.fragments).toBe(10);
    const messages = transport.published.filter((m) => m.channel === HYBRID);
    expect(messages).toHaveLength(10);
    expect(messages.every((m) => m.bytes < 1024 && m.headers['x-claim-check'] === 1)).toBe(true);
    expect(receivers.reassembled).toHaveLength(1);
    expect(receivers.reassembled[0].equals(payload)).toBe(true);
    // Parked bodies are deleted after each ack, in the background: the ack does not wait.
    await eventually(async () => (await payloadFiles()).length === 0, 'the parked bodies deleted');
  });

  /** Sends `payload` via claim check and waits until it is handled and its bodies deleted. */
  async function sentAndSettled(payload: Buffer) {
    await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();
    await eventually(async () => (await payloadFiles()).length === 0, 'the parked bodies deleted');
    return transport.published.filter((m) => m.channel === HYBRID);
  }

  it('acks a duplicate of a fragment whose parked body its first copy had deleted', async () => {
    const payload = randomBytes(200 * 1024);
    const [first] = await sentAndSettled(payload);

    // The broker delivers at least once: the first fragment comes again, after completion.
    await transport.publish(HYBRID, first.body, first.headers);
    await transport.whenIdle();

    expect(deadLetters(transport, HYBRID)).toHaveLength(0);
    expect(receivers.reassembled).toHaveLength(1);
  });

  it('acks a duplicate of a stored fragment of a sequence still open', async () => {
    const payload = randomBytes(200 * 1024);
    // The last fragment is held back: the sequence stays open with the others stored.
    transport.withhold = (headers) => headers['x-sequence-position'] === 4;
    await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();
    // Left: the held-back fragment's parked body and its metadata file.
    await eventually(async () => (await payloadFiles()).length === 2, 'three bodies deleted');
    const [first] = transport.published.filter((m) => m.channel === HYBRID);

    await transport.publish(HYBRID, first.body, first.headers);
    await transport.whenIdle();
    expect(deadLetters(transport, HYBRID)).toHaveLength(0);

    await transport.deliverWithheld();
    await transport.whenIdle();
    expect(receivers.reassembled).toHaveLength(1);
    expect(receivers.reassembled[0].equals(payload)).toBe(true);
    expect(deadLetters(transport, HYBRID)).toHaveLength(0);
  });

  it('dead-letters a fragment whose parked body is gone and which the store does not have', async () => {
    const payload = randomBytes(200 * 1024);
    transport.withhold = (headers) => headers['x-sequence-position'] === 4;
    await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();
    await eventually(async () => (await payloadFiles()).length === 2, 'three bodies deleted');
    // The held-back fragment's parked body is lost (swept, say) before it arrives.
    for (const file of await payloadFiles()) await rm(join(file.parentPath, file.name));

    await transport.deliverWithheld();
    await transport.whenIdle();

    const [dead, ...more] = deadLetters(transport, HYBRID);
    expect(more).toHaveLength(0);
    expect(deathReasonOf(dead)).toMatch(/^claim-check-not-found: /);
  });

  describe('a copy that arrives after its ticket expired', () => {
    afterEach(() => jest.restoreAllMocks());
    const later = (ms: number) => {
      const now = Date.now();
      jest.spyOn(Date, 'now').mockReturnValue(now + ms);
    };

    it('is acked as a duplicate when its sequence completed', async () => {
      const payload = randomBytes(200 * 1024);
      const [first] = await sentAndSettled(payload);
      later(120_000);

      await transport.publish(HYBRID, first.body, first.headers);
      await transport.whenIdle();

      expect(deadLetters(transport, HYBRID)).toHaveLength(0);
      expect(receivers.reassembled).toHaveLength(1);
    });

    it('is requeued, not acked, while its complete sequence is being delivered', async () => {
      let open!: () => void;
      receivers.gate = new Promise<void>((resolve) => (open = resolve));
      const payload = randomBytes(200 * 1024);
      await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
      await eventually(() => receivers.calls === 1, 'the handler at work');
      const sent = transport.published.filter((m) => m.channel === HYBRID);
      const last = sent[sent.length - 1];
      later(120_000);

      // The completing fragment comes again while its handler works (its first delivery
      // requeued, or a copy): acked, it could no longer start a delivery that did not happen.
      const recorder = recordEvents(app);
      await transport.publish(HYBRID, last.body, last.headers);
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(deadLetters(transport, HYBRID)).toHaveLength(0);
      expect(recorder.only('fragment.duplicate')).toHaveLength(0); // requeued, again and again

      open();
      await eventually(
        () => recorder.only('fragment.duplicate').length === 1,
        'the copy acked once the sequence was delivered',
      );
      recorder.stop();
      await transport.whenIdle();
      expect(receivers.reassembled).toHaveLength(1);
      expect(deadLetters(transport, HYBRID)).toHaveLength(0);
    });

    it('is dead-lettered claim-ticket-invalid when the store never had it', async () => {
      const payload = randomBytes(200 * 1024);
      const [first] = await sentAndSettled(payload);
      later(120_000);

      await transport.publish(HYBRID, first.body, { ...first.headers, 'x-sequence-id': 'never-2' });
      await transport.whenIdle();

      const [dead, ...more] = deadLetters(transport, HYBRID);
      expect(more).toHaveLength(0);
      expect(deathReasonOf(dead)).toMatch(
        /^claim-ticket-invalid: claim ticket refused \(expired\)/,
      );
    });
  });

  it('keeps a parked body until its message is acked: a completing fragment requeued after the handler could not read is resolved again and delivered once', async () => {
    const payload = randomBytes(200 * 1024);
    sequenceStore.failNextReads = 1;

    await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();

    expect(sequenceStore.failNextReads).toBe(0);
    expect(sequenceStore.accepts.filter((a) => a.status === 'complete')).toHaveLength(2);
    expect(receivers.reassembled).toHaveLength(1);
    expect(receivers.reassembled[0].equals(payload)).toBe(true);
    expect(deadLetters(transport, HYBRID)).toHaveLength(0);
    // Parked bodies are deleted after each ack, in the background: the ack does not wait.
    await eventually(async () => (await payloadFiles()).length === 0, 'the parked bodies deleted');
  });

  it('takes a message with an x-sequence-id of any type for a fragment: a byte-array id is reassembled, a numeric one dead-lettered, neither handed over as an inline payload', async () => {
    const payload = bytes(3_000, 11);
    const [asBytes] = makeFragments('id-as-bytes', payload, 3_000);
    const [asNumber] = makeFragments('id-as-number', bytes(3_000, 12), 3_000);
    // An AMQP byte array arrives as a Buffer (another program's client may send ids that way).
    await transport.publish(AUTO, asBytes.body, {
      ...asBytes.headers,
      'x-sequence-id': Buffer.from('id-as-bytes') as unknown as string,
    });
    await transport.publish(AUTO, asNumber.body, { ...asNumber.headers, 'x-sequence-id': 42 });
    await transport.whenIdle();

    expect(receivers.claimed.map((c) => ({ via: c.via, bytes: c.bytes }))).toEqual([
      { via: 'sequence', bytes: payload },
    ]);
    const dead = deadLetters(transport, AUTO);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(/^malformed-header: x-sequence-id/);
  });

  it('takes any message with an x-sequence-* or x-fragment-* header for a fragment: one without its id is dead-lettered malformed-header, never handed over whole', async () => {
    const [fragment] = makeFragments('no-id', bytes(3_000, 13), 1_000);
    const { 'x-sequence-id': _id, ...withoutId } = fragment.headers;
    await transport.publish(AUTO, fragment.body, withoutId);
    await transport.publish(AUTO, Buffer.from('a lone crc'), { 'x-fragment-crc32': 7 });
    await transport.whenIdle();

    expect(receivers.claimed).toHaveLength(0);
    const dead = deadLetters(transport, AUTO);
    expect(dead.map(deathReasonOf)).toEqual([
      expect.stringMatching(/^malformed-header: x-sequence-id/),
      expect.stringMatching(/^malformed-header: x-sequence-id/),
    ]);
  });

  it('dead-letters a fragment whose ticket was tampered with, and delivers nothing of it', async () => {
    const payload = randomBytes(100 * 1024);
    const original = transport.publish.bind(transport);
    transport.publish = (channel, body, headers, options) => {
      if (headers['x-sequence-position'] !== 1) return original(channel, body, headers, options);
      const ticket = JSON.parse(body.toString()) as { bytes: number };
      const forged = Buffer.from(JSON.stringify({ ...ticket, bytes: ticket.bytes + 1 }));
      return original(channel, forged, headers, options);
    };

    await app.get(SplitterService).send(HYBRID, payload, { via: 'claim-check' });
    await transport.whenIdle();

    const dead = deadLetters(transport, HYBRID);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(/^claim-ticket-invalid: .*bad-signature/);
    expect(receivers.reassembled).toHaveLength(0);
  });
});

describe('claim check: choosing by size with headers, on a transport of small messages', () => {
  // 40,000-byte messages less the 16 KiB header allowance: inlineMaxBytes is 23,616.
  const INLINE_MAX = 40_000 - 16 * 1024;
  // Within the 16 KiB maxHeaderBytes, but too many bytes for an inline payload of INLINE_MAX.
  const heavy = { note: 'x'.repeat(16_370) };
  let app: INestApplicationContext;
  let root: string;
  let transport: MeasuringTransport;
  let receivers: Receivers;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'cc-fit-'));
    transport = new MeasuringTransport({ maxMessageBytes: 40_000 });
    app = await bootReceivers({
      transport,
      claimCheck: { store: new FilesystemPayloadStore({ root }) },
      tuning: { sweepers: { orphans: { intervalMs: false }, expiry: { intervalMs: false } } },
      sequence: { fragmentBytes: 8 * 1024, maxSequenceBytes: 100_000 },
    });
    receivers = app.get(Receivers);
  });

  afterEach(async () => {
    await app.close();
    await rm(root, { recursive: true, force: true });
  });

  it.each([
    { mode: 'claim-check', what: 'at inlineMaxBytes', headers: heavy, via: 'ticket' },
    { mode: 'auto', what: 'at inlineMaxBytes', headers: heavy, via: 'sequence' },
    { mode: 'auto', what: 'streamed at inlineMaxBytes', headers: heavy, via: 'sequence' },
    { mode: 'auto', what: "over the module's maxSequenceBytes", headers: {}, via: 'ticket' },
  ] as const)(
    'in mode $mode, sends a payload $what that one message or a sequence could not carry as a $via',
    async ({ mode, what, headers, via }) => {
      const sent = randomBytes(what.startsWith('over') ? 100_001 : INLINE_MAX);
      const streamed = what.startsWith('streamed');

      const receipt = await app
        .get(ClaimCheckService)
        .publish(AUTO, streamed ? Readable.from([sent]) : sent, {
          mode,
          headers,
          ...(streamed && { bytes: sent.length }),
        });
      await transport.whenIdle();

      expect(receipt.via).toBe(via);
      expect(receivers.claimed.map((c) => c.via)).toEqual([via]);
      expect(receivers.claimed[0].bytes.equals(sent)).toBe(true);
      expect(deadLetters(transport, AUTO)).toHaveLength(0);
    },
  );

  it('still sends a payload at inlineMaxBytes inline when its headers leave room', async () => {
    const receipt = await app
      .get(ClaimCheckService)
      .publish(AUTO, randomBytes(INLINE_MAX), { mode: 'auto', headers: { note: 'x' } });

    expect(receipt.via).toBe('inline');
  });
});

describe('claim check: an expired sequence of a @ClaimCheck channel', () => {
  it("is recorded in the channel's own deadLetterChannel, by an instance that never took one of its fragments", async () => {
    const channel = 'cc.expiring';
    const store = new MemorySequenceStore();
    const t = await createClaimCheckTestApp({
      handlers: [{ channel, deadLetterChannel: 'cc.expiring.graveyard' }],
      module: {
        sequence: { store },
      },
    });
    try {
      // A fragment another instance stored (into the shared store), of a sequence never completed.
      const [first] = makeFragments('half-sent', bytes(2_000, 3), 1_000);
      const now = Date.now();
      await store.accept(
        { ...parseFragmentHeaders(first.headers), scope: channel, body: first.body },
        {
          now,
          consumerId: 'another-instance',
          leaseMs: 30_000,
          expiry: { ms: 1_000, strategy: 'fixed' },
          limits: {
            maxSequenceBytes: 1 << 20,
            maxFragments: 10,
            maxBufferedBytes: 1 << 20,
            maxOpenSequences: 10,
          },
          retentionMs: 60_000,
        },
      );

      expect(await t.app.get(ExpirySweeper).sweep(now + 1_000)).toBe(1);

      expect(t.transport.peek('cc.expiring.graveyard')).toHaveLength(1);
      expect(t.transport.peek(`${channel}.dlq`)).toHaveLength(0);
    } finally {
      await t.close();
      await store.close();
    }
  });
});
