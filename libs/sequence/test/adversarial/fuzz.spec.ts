import { randomUUID } from 'node:crypto';
import fc from 'fast-check';
import { InMemoryTransport, ResequencerService, type RejectionCode } from 'nest-sequence';
import {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  ResequenceHeader,
  sha256Hex,
  type HeaderMap,
} from 'nest-sequence/wire';
import { InvalidHeaderError } from 'nest-sequence';
import { bytes, makeFragments, makeStreamingFragments } from '../support/sequence-test-app';
import {
  BUDGETS,
  createAdversarialApp,
  INBOX_EVENT_TYPE,
  KiB,
  type AdversarialApp,
  type ChannelKind,
  type DeadLetter,
} from './adversarial-app';

/**
 * Header maps a hostile publisher could send, through the real receive path of every pattern:
 * the in-memory transport delivering to a SequenceModule application with one consumer of each
 * kind. Properties: nothing throws or hangs; every refused message is dead-lettered with a known
 * code; handlers receive only complete, verified payloads a valid producer sent; the stores stay
 * within their budgets.
 */

/** Fixed, so that CI is reproducible; `FUZZ_SEED` replays another. */
const SEED = Number(process.env.FUZZ_SEED ?? 20261202);
/** Runs per consumer: five consumers, 10,000 runs in all. `FUZZ_RUNS` changes it. */
const RUNS_PER_CHANNEL = Number(process.env.FUZZ_RUNS ?? 2_000);

/** A time past every deadline: a sweep as of then empties every buffer. */
const LATER_MS = 3_600_000;

/** Every `x-death-reason` code: a Record over the union, so that a new code must be listed. */
const KNOWN_CODES: Record<RejectionCode, true> = {
  'malformed-header': true,
  'unsupported-version': true,
  'crc-mismatch': true,
  'fragment-too-large': true,
  'headers-too-large': true,
  'position-out-of-range': true,
  'size-changed': true,
  'duplicate-last': true,
  'conflicting-duplicate': true,
  'declaration-changed': true,
  'sequence-too-large': true,
  'too-many-fragments': true,
  'integrity-mismatch': true,
  'sequence-rejected': true,
  'sequence-expired': true,
  'handler-failed': true,
  'handler-timeout': true,
  'claim-ticket-invalid': true,
  'wrong-audience': true,
  'unknown-payload-store': true,
  'claim-check-not-found': true,
  'store-unavailable': true,
  'invalid-resequence-event': true,
  'resequencer-buffer-full': true,
  'resequencer-gap-alert': true,
  'resequencer-gap-skipped': true,
  'resequencer-gap-dead-letter': true,
  'resequencer-output-unsendable': true,
  'invalid-inbox-message': true,
  'no-inbox-handler': true,
  'no-handler': true,
  undecodable: true,
  forbidden: true,
  'invalid-payload': true,
};

function codeOf(deadLetter: DeadLetter): string {
  return String(deadLetter.headers['x-death-reason']).split(':')[0];
}

// ---------------------------------------------------------------------------------------------
// What a valid producer sends

/** The payloads valid producers send: one fragment, and three. */
const PAYLOADS = [bytes(3 * KiB, 21), bytes(5 * KiB, 22)];
const FRAGMENT_BYTES = [3 * KiB, 2 * KiB];
const VALID_SHA256 = new Set(PAYLOADS.map((payload) => sha256Hex(payload)));

const CONTRACT_NAMES = [
  'x-sequence-id',
  'x-sequence-position',
  'x-sequence-size',
  'x-sequence-last',
  'x-sequence-version',
  'x-sequence-bytes',
  'x-sequence-sha256',
  'x-fragment-crc32',
  'x-claim-check',
  ResequenceHeader.key,
  ResequenceHeader.seq,
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  'content-type',
  'content-encoding',
  'X-Sequence-Id',
  'x-sequence-extra',
  'x-fragment-extra',
  'x-death-reason',
  'x-requeue-count',
  'x-delivery-count',
];

// ---------------------------------------------------------------------------------------------
// Arbitraries

const hostileNumber = fc.oneof(
  fc.integer(),
  fc.constantFrom(0, -0, -1, 1, 2, 3, 1.5, 2 ** 31, 2 ** 32, 2 ** 53, 2 ** 60, -(2 ** 60), 1e300),
  fc.double({ noNaN: true, noDefaultInfinity: true, min: -1e6, max: 1e6 }),
);

const hostileString = fc.oneof(
  fc.constantFrom(
    'NaN',
    'Infinity',
    '-1',
    '0',
    '1',
    '01',
    '1e3',
    '1.0',
    'true',
    'false',
    'yes',
    '',
    ' 1',
    '\u0000',
    'a\ud800b',
    '\udc00',
    '../../etc/passwd',
    'f'.repeat(64),
    'event',
    'command',
    INBOX_EVENT_TYPE,
  ),
  fc.string({ maxLength: 40 }),
  fc.string({ unit: 'binary', maxLength: 40 }),
  fc.string({ minLength: 100, maxLength: 300 }),
);

const hostileValue: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 3, arbitrary: hostileNumber },
  { weight: 3, arbitrary: hostileString },
  fc.boolean(),
  fc.constant(null),
  fc.uint8Array({ maxLength: 40 }).map((array) => Buffer.from(array)),
  hostileString.map((text) => Buffer.from(text)),
  fc.array(fc.oneof(fc.integer(), fc.string({ maxLength: 5 })), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.integer(), { maxKeys: 3 }),
);

const headerName = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom(...CONTRACT_NAMES) },
  fc.string({ minLength: 1, maxLength: 20 }),
);

/** Headers to set (to hostile values) and names to remove, on top of a valid message. */
interface Mutation {
  readonly set: Record<string, unknown>;
  readonly remove: readonly string[];
  /** Replaces the body. */
  readonly body?: Buffer;
}

const mutation: fc.Arbitrary<Mutation> = fc.record({
  set: fc.dictionary(headerName, hostileValue, { maxKeys: 4 }),
  remove: fc.subarray(CONTRACT_NAMES, { maxLength: 3 }),
  body: fc.option(
    fc.oneof(
      fc.uint8Array({ maxLength: 64 }).map((array) => Buffer.from(array)),
      fc.constant(Buffer.alloc(0)),
      fc.constant(bytes(BUDGETS.maxFragmentBytes + 1, 23)),
    ),
    { nil: undefined },
  ),
});

/** One run: a valid message (or all fragments of a sequence, shuffled), one of them mutated. */
interface Run {
  readonly payload: number;
  readonly streaming: boolean;
  readonly order: readonly number[];
  /** Which message gets the mutation; none: the run is valid and must be delivered. */
  readonly mutated?: { readonly index: number; readonly mutation: Mutation };
  /** Sends one of the messages twice. */
  readonly duplicate: boolean;
}

const runs: fc.Arbitrary<Run> = fc
  .record({
    payload: fc.nat({ max: PAYLOADS.length - 1 }),
    streaming: fc.boolean(),
    duplicate: fc.boolean(),
  })
  .chain(({ payload, streaming, duplicate }) => {
    const count = Math.ceil(PAYLOADS[payload].length / FRAGMENT_BYTES[payload]);
    const indices = Array.from({ length: count }, (_, i) => i);
    return fc.record({
      payload: fc.constant(payload),
      streaming: fc.constant(streaming),
      duplicate: fc.constant(duplicate),
      order: fc.shuffledSubarray(indices, { minLength: count, maxLength: count }),
      mutated: fc.option(fc.record({ index: fc.nat({ max: count - 1 }), mutation: mutation }), {
        nil: undefined,
        freq: 4,
      }),
    });
  });

function mutate(
  message: { body: Buffer; headers: Record<string, unknown> },
  change: Mutation,
): { body: Buffer; headers: Record<string, unknown> } {
  const headers: Record<string, unknown> = { ...message.headers };
  for (const name of change.remove) delete headers[name];
  Object.assign(headers, change.set);
  return { body: change.body ?? message.body, headers };
}

/** The messages of one run on `kind`'s channel, with `id` (unique to the run) for its own. */
function messagesOf(kind: ChannelKind, run: Run, id: string) {
  let valid: { body: Buffer; headers: Record<string, unknown> }[];
  switch (kind) {
    case 'reassemble':
    case 'stream':
    case 'claim': {
      const split = run.streaming ? makeStreamingFragments : makeFragments;
      valid = split(id, PAYLOADS[run.payload], FRAGMENT_BYTES[run.payload]);
      break;
    }
    case 'resequenced':
      // Seq 1, then 2 and 3 (buffered until 1 arrives, in whatever order).
      valid = [1, 2, 3].slice(0, run.order.length).map((seq) => ({
        body: Buffer.from(`${id}#${seq}`),
        headers: { [ResequenceHeader.key]: id, [ResequenceHeader.seq]: seq },
      }));
      break;
    case 'inbox': {
      const event = {
        id,
        type: INBOX_EVENT_TYPE,
        aggregateType: 'Fuzz',
        aggregateId: id,
        payload: { run: id },
        occurredAt: new Date(0).toISOString(),
      };
      valid = [
        {
          body: Buffer.from(JSON.stringify(event)),
          headers: {
            [MESSAGE_ID_HEADER]: id,
            [MESSAGE_KIND_HEADER]: 'event',
            [MESSAGE_TYPE_HEADER]: INBOX_EVENT_TYPE,
          },
        },
      ];
      break;
    }
  }
  const ordered = run.order.filter((i) => i < valid.length).map((i) => ({ index: i, ...valid[i] }));
  const sent = ordered.map(({ index, body, headers }) =>
    run.mutated?.index === index
      ? mutate({ body, headers }, run.mutated.mutation)
      : { body, headers },
  );
  if (run.duplicate && sent.length > 0) sent.push(sent[0]);
  return sent;
}

// ---------------------------------------------------------------------------------------------

describe(`fuzzing header maps through the real receive path (seed ${SEED})`, () => {
  let app: AdversarialApp;
  let transport: InMemoryTransport;
  let resequencers: ResequencerService;

  // An app for each consumer, as fresh as the first one had it: the resequencer store keeps every
  // key for its retention and a run scans them all (`buffers()`), so the keys the stream and
  // resequenced runs leave would make each later run slower than the one before it.
  beforeEach(async () => {
    // Markers outlive a run, so a duplicate sent within it is dropped, not delivered again; the
    // sweep after it, as of LATER_MS, ends their retention (and that of failed sequences).
    // A duplicate sent while its sequence is being delivered is handed back to come again: it
    // still goes round the transport's delayed requeue, after 1 ms rather than 20, which every
    // run would otherwise wait out.
    app = await createAdversarialApp('embedded', {
      retentionMs: LATER_MS / 2,
      backpressureDelayMs: 1,
    });
    transport = app.producer as InMemoryTransport;
    resequencers = app.app.get(ResequencerService);
  });
  afterEach(async () => {
    await app?.close();
  });

  /** Waits until the app has settled every message, failing (not hanging) on a message loop. */
  async function settled(what: string): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        transport.whenIdle(),
        new Promise((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`the app did not settle ${what}: a message keeps coming back`)),
            10_000,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
  }

  const kinds: ChannelKind[] = ['reassemble', 'stream', 'claim', 'resequenced', 'inbox'];

  it.each(kinds)(
    `%s: ${RUNS_PER_CHANNEL} runs`,
    async (kind) => {
      const channel = app.channels[kind];
      let refusedAtPublish = 0;
      let deadLettered = 0;
      await fc.assert(
        fc.asyncProperty(runs, async (run) => {
          const id = `fz-${randomUUID()}`;
          const before = {
            reassembled: app.reassembled.deliveries.length,
            streamed: app.streamed.fragments.length,
            claimed: app.claimed.payloads.length,
            ordered: app.ordered.events.length,
          };
          const messages = messagesOf(kind, run, id);
          for (const { body, headers } of messages) {
            try {
              await app.producer.publish(channel, body, headers as HeaderMap);
            } catch (error) {
              // Headers no broker carries (AMQP's encoder would fail): refused before sending.
              if (!(error instanceof InvalidHeaderError)) throw error;
              refusedAtPublish++;
            }
          }
          await settled(`run ${id}`);
          // Within the budgets, before any sweep.
          const held = await app.sequenceStore.stats(Date.now());
          expect(held.bufferedBytes + (held.reservedBytes ?? 0)).toBeLessThanOrEqual(
            BUDGETS.maxBufferedBytes,
          );
          for (const buffers of Object.values(await resequencers.buffers())) {
            expect(buffers.bytes).toBeLessThanOrEqual(buffers.maxBytes);
            expect(buffers.events).toBeLessThanOrEqual(buffers.maxEvents);
          }
          // Empties what the run left open (the fuzzer cannot park payloads: no orphan sweep).
          const later = Date.now() + LATER_MS;
          const left = await app.sequenceStore.stats(later);
          if (left.openSequences > 0 || left.bufferedBytes > 0) {
            await app.sweepers.expiry.sweep(later);
          }
          if (kind === 'stream' || kind === 'resequenced') await app.sweepers.gaps.sweep(later);
          await settled(`the sweep after run ${id}`);

          // Every refusal is a dead letter with a known code.
          const dead = await app.takeDeadLetters(channel);
          deadLettered += dead.length;
          for (const letter of dead) expect(KNOWN_CODES).toHaveProperty([codeOf(letter)]);

          // Handlers: only complete, verified payloads of a valid producer.
          for (const delivery of app.reassembled.deliveries.slice(before.reassembled)) {
            expect(VALID_SHA256.has(sha256Hex(delivery.bytes))).toBe(true);
            expect(delivery.payload.sha256).toBe(sha256Hex(delivery.bytes));
          }
          for (const payload of app.claimed.payloads.slice(before.claimed)) {
            // Tickets cannot be forged, and sequences are verified; inline bodies carry no
            // fragment header (checked independently of the library's own test).
            expect(payload.via).not.toBe('ticket');
            if (payload.via === 'sequence') {
              expect(VALID_SHA256.has(sha256Hex(payload.bytes))).toBe(true);
            }
          }
          if (kind === 'claim') {
            const inline = app.claimed.payloads
              .slice(before.claimed)
              .filter((p) => p.via === 'inline');
            const inlineShaped = messages.filter(({ headers }) => isInlineShaped(headers));
            expect(inline).toHaveLength(inlineShaped.length);
          }
          const streamed = app.streamed.fragments.slice(before.streamed);
          const bySequence = new Map<string, typeof streamed>();
          for (const fragment of streamed) {
            bySequence.set(fragment.sequenceId, [
              ...(bySequence.get(fragment.sequenceId) ?? []),
              fragment,
            ]);
          }
          for (const fragments of bySequence.values()) {
            // In order, each once; a last fragment only when the whole payload verified.
            expect(fragments.map((f) => f.position)).toEqual(fragments.map((_, i) => i + 1));
            const last = fragments.find((f) => f.last);
            if (last) {
              expect(last.verified).toBe(true);
              expect(VALID_SHA256.has(sha256Hex(Buffer.concat(fragments.map((f) => f.body))))).toBe(
                true,
              );
            }
          }
          const ordered = app.ordered.events.slice(before.ordered);
          const seqsOf = new Map<string, number[]>();
          for (const event of ordered)
            seqsOf.set(event.key, [...(seqsOf.get(event.key) ?? []), event.seq]);
          for (const seqs of seqsOf.values()) {
            for (let i = 1; i < seqs.length; i++) expect(seqs[i]).toBeGreaterThan(seqs[i - 1]);
          }

          // A run no one spoilt reaches its handler.
          if (run.mutated === undefined) {
            const delivered = {
              reassemble: () => app.reassembled.of(id).length === 1,
              stream: () => streamed.some((f) => f.sequenceId === id && f.last),
              claim: () => app.claimed.payloads.some((p) => p.sequenceId === id),
              resequenced: () =>
                ordered.filter((e) => e.key === id).length ===
                messages.length - (run.duplicate ? 1 : 0),
              inbox: () => true,
            }[kind];
            expect(delivered()).toBe(true);
          }

          // Empty after the sweep (failed sequences' fragments are kept until their retention
          // ends, as of the sweep's time).
          expect(await app.sequenceStore.stats(later)).toMatchObject({
            openSequences: 0,
            bufferedBytes: 0,
          });
          for (const buffers of Object.values(await resequencers.buffers())) {
            expect(buffers.events).toBe(0);
          }
        }),
        { seed: SEED, numRuns: RUNS_PER_CHANNEL },
      );
      // Most runs went through the receive path, and many were refused there.
      expect(refusedAtPublish).toBeLessThan(RUNS_PER_CHANNEL / 2);
      expect(deadLettered).toBeGreaterThan(RUNS_PER_CHANNEL / 10);
      // Still alive: the inbox processor ran every valid event it took.
      if (kind === 'inbox')
        expect(app.inboxed.events.every((e) => e.type === INBOX_EVENT_TYPE)).toBe(true);
    },
    120_000,
  );
});

/**
 * Whether a message is a whole payload for a `@ClaimCheck` consumer, by the documented rule:
 * no header of the fragment contract, and `x-claim-check` absent, 0 or false.
 */
function isInlineShaped(headers: Record<string, unknown>): boolean {
  if (Object.keys(headers).some((name) => /^x-(sequence|fragment)-/i.test(name))) return false;
  const marking = headers['x-claim-check'];
  const text = Buffer.isBuffer(marking) ? marking.toString('utf8') : marking;
  return [undefined, null, 0, '0', false, 'false'].includes(text as never);
}
