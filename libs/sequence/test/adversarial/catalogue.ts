/**
 * The hostile inputs of the adversarial suite: what a party that may publish to a channel sends
 * (see docs/security.md, "Threat model"), and the `x-death-reason` each is refused with.
 */
import type { RejectionCode } from 'nest-sequence';
import {
  buildFragmentHeaders,
  ClaimTicketKeyring,
  crc32,
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  ResequenceHeader,
  serializeTicket,
  sha256Hex,
  signTicket,
  type ClaimTicket,
} from 'nest-sequence/wire';
import { bytes, makeFragments, makeStreamingFragments } from '../support/sequence-test-app';
import {
  BUDGETS,
  FORGER_KEYS,
  INBOX_EVENT_TYPE,
  KiB,
  SIGNING_KEYS,
  type AdversarialApp,
  type ChannelKind,
} from './adversarial-app';

/** A message as a hostile publisher writes it: any body, any header values. */
export interface RawMessage {
  readonly body: Buffer;
  readonly headers: Record<string, unknown>;
}

/** What a case gets to build its messages with. */
export interface CaseContext {
  readonly app: AdversarialApp;
  /** A sequence id (or key, or message id) of this case's own: `adv-<case>-<tag>`. */
  id(tag?: string): string;
  /** Run after the case to undo what the producer side did (a parked payload, say). */
  onCleanup(cleanup: () => Promise<unknown>): void;
}

export interface HostileCase {
  readonly name: string;
  /** The consumer it is sent to. */
  readonly channel: ChannelKind;
  messages(context: CaseContext): RawMessage[] | Promise<RawMessage[]>;
  /** The reason codes of the dead letters it causes before any sweep, in any order. */
  readonly deadLetters: readonly RejectionCode[];
  /** The reason codes of those a sweep then causes (expiry records, a gap's dead letters). */
  readonly afterSweep?: readonly RejectionCode[];
  /**
   * It fills a budget: part of it is back-pressured (requeued) until sweeps free the budget, and
   * the sweeps are repeated until every expected dead letter has come.
   */
  readonly backpressure?: boolean;
  /** Nothing of it may reach the store: no key names its ids. */
  readonly storesNothing?: boolean;
  /**
   * Stream mode only: fragments before the hostile one may reach the handler, never a `last`
   * one. Elsewhere the handler must see nothing of the case.
   */
  readonly partialStreamAllowed?: boolean;
}

// ---------------------------------------------------------------------------------------------
// Building blocks

const PAYLOAD = bytes(3 * KiB, 3);

/** One well-formed single-fragment sequence of `id`. */
function single(id: string, body: Buffer = PAYLOAD): RawMessage {
  return makeFragments(id, body, body.length)[0];
}

/** A well-formed single fragment with `changes` applied to its headers (undefined removes). */
function spoilt(id: string, changes: Record<string, unknown>, body: Buffer = PAYLOAD): RawMessage {
  const { headers } = single(id, body);
  const spoiltHeaders: Record<string, unknown> = { ...headers };
  for (const [name, value] of Object.entries(changes)) {
    if (value === undefined) delete spoiltHeaders[name];
    else spoiltHeaders[name] = value;
  }
  return { body, headers: spoiltHeaders };
}

/** The first fragment of a sequence of `size` fragments of `fragmentBytes` that never ends. */
function firstOf(id: string, size: number, fragmentBytes: number, declaredBytes?: number) {
  const body = bytes(fragmentBytes, id.length);
  return {
    body,
    headers: buildFragmentHeaders({
      sequenceId: id,
      position: 1,
      size,
      last: size === 1,
      crc32: crc32(body),
      bytes: declaredBytes ?? size * fragmentBytes,
      sha256: size === 1 ? sha256Hex(body) : undefined,
    }),
  };
}

/** A fragment of a streamed sequence (no size): empty, never ending. */
function emptyStreamed(id: string): RawMessage {
  const body = Buffer.alloc(0);
  return {
    body,
    headers: buildFragmentHeaders({ sequenceId: id, position: 1, last: false, crc32: crc32(body) }),
  };
}

function keyring(keys = SIGNING_KEYS): ClaimTicketKeyring {
  return new ClaimTicketKeyring(keys);
}

function ticketMessage(ticket: ClaimTicket | Buffer): RawMessage {
  return {
    body: Buffer.isBuffer(ticket) ? ticket : serializeTicket(ticket),
    headers: { 'x-claim-check': 1 },
  };
}

/** A ticket for a payload parked now, issued for `audience`; released after the case. */
async function parkedTicket(
  context: CaseContext,
  audience: string,
  ttlMs = 600_000,
): Promise<ClaimTicket> {
  const ticket = await context.app.claimCheck.checkIn(bytes(8 * KiB, 5), { audience, ttlMs });
  context.onCleanup(() => context.app.claimCheck.release(ticket));
  return ticket;
}

function event(id: string, changes: Record<string, unknown> = {}) {
  return {
    id,
    type: INBOX_EVENT_TYPE,
    aggregateType: 'Adversary',
    aggregateId: 'a-1',
    payload: { n: 1 },
    occurredAt: new Date(0).toISOString(),
    ...changes,
  };
}

function inboxMessage(
  body: unknown,
  headers: Record<string, unknown> = {},
  id = (body as { id?: string }).id,
): RawMessage {
  return {
    body: Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body)),
    headers: {
      [MESSAGE_ID_HEADER]: id,
      [MESSAGE_KIND_HEADER]: 'event',
      [MESSAGE_TYPE_HEADER]: INBOX_EVENT_TYPE,
      'content-type': 'application/json',
      ...headers,
    },
  };
}

function resequenced(
  headers: Record<string, unknown>,
  body: Buffer = Buffer.from('event'),
): RawMessage {
  return { body, headers };
}

const LONE_SURROGATE = 'a\ud800b';

// ---------------------------------------------------------------------------------------------
// The catalogue

const fragmentHeaderCases: HostileCase[] = [
  ['no headers at all', () => ({ body: Buffer.from('not a fragment'), headers: {} })],
  ['x-sequence-id missing', (id: string) => spoilt(id, { 'x-sequence-id': undefined })],
  [
    'x-sequence-id of forbidden characters',
    (id: string) => spoilt(id, { 'x-sequence-id': '../../etc' }),
  ],
  [
    'x-sequence-id of 129 characters',
    (id: string) => spoilt(id, { 'x-sequence-id': 'a'.repeat(129) }),
  ],
  [
    'x-sequence-id with a lone surrogate',
    (id: string) => spoilt(id, { 'x-sequence-id': `${id}${LONE_SURROGATE}` }),
  ],
  ['x-sequence-id as a table', (id: string) => spoilt(id, { 'x-sequence-id': { id } })],
  ['x-sequence-position missing', (id: string) => spoilt(id, { 'x-sequence-position': undefined })],
  ['x-sequence-position 0', (id: string) => spoilt(id, { 'x-sequence-position': 0 })],
  ['x-sequence-position negative', (id: string) => spoilt(id, { 'x-sequence-position': -1 })],
  [
    'x-sequence-position not an integer',
    (id: string) => spoilt(id, { 'x-sequence-position': 1.5 }),
  ],
  ['x-sequence-position "NaN"', (id: string) => spoilt(id, { 'x-sequence-position': 'NaN' })],
  ['x-sequence-position 2^60', (id: string) => spoilt(id, { 'x-sequence-position': 2 ** 60 })],
  ['x-sequence-position "01"', (id: string) => spoilt(id, { 'x-sequence-position': '01' })],
  ['x-sequence-position as an array', (id: string) => spoilt(id, { 'x-sequence-position': [1] })],
  ['x-sequence-position beyond its size', (id: string) => spoilt(id, { 'x-sequence-position': 2 })],
  ['x-sequence-size 0', (id: string) => spoilt(id, { 'x-sequence-size': 0 })],
  ['x-sequence-size negative', (id: string) => spoilt(id, { 'x-sequence-size': -3 })],
  ['x-sequence-bytes negative', (id: string) => spoilt(id, { 'x-sequence-bytes': -1 })],
  ['x-sequence-bytes 1e300', (id: string) => spoilt(id, { 'x-sequence-bytes': 1e300 })],
  ['x-fragment-crc32 missing', (id: string) => spoilt(id, { 'x-fragment-crc32': undefined })],
  ['x-fragment-crc32 negative', (id: string) => spoilt(id, { 'x-fragment-crc32': -5 })],
  ['x-fragment-crc32 over 32 bits', (id: string) => spoilt(id, { 'x-fragment-crc32': 2 ** 32 })],
  ['x-sequence-version missing', (id: string) => spoilt(id, { 'x-sequence-version': undefined })],
  ['x-sequence-last "yes"', (id: string) => spoilt(id, { 'x-sequence-last': 'yes' })],
  [
    'x-sequence-sha256 missing on the last fragment',
    (id: string) => spoilt(id, { 'x-sequence-sha256': undefined }),
  ],
  [
    'x-sequence-sha256 not hexadecimal',
    (id: string) => spoilt(id, { 'x-sequence-sha256': 'z'.repeat(64) }),
  ],
  [
    'x-sequence-sha256 as a Buffer of garbage',
    (id: string) => spoilt(id, { 'x-sequence-sha256': Buffer.from([0xff, 0xfe, 0x00]) }),
  ],
].map(([name, build]) => ({
  name: `fragment: ${name as string}`,
  channel: 'reassemble' as const,
  messages: (context: CaseContext) => [(build as (id: string) => RawMessage)(context.id())],
  deadLetters: ['malformed-header'],
  storesNothing: true,
}));

const sequenceCases: HostileCase[] = [
  ...fragmentHeaderCases,
  {
    name: 'fragment: x-sequence-version 2',
    channel: 'reassemble',
    messages: ({ id }) => [spoilt(id(), { 'x-sequence-version': 2 })],
    deadLetters: ['unsupported-version'],
    storesNothing: true,
  },
  {
    name: 'fragment: body does not match its CRC-32',
    channel: 'reassemble',
    messages: ({ id }) => [spoilt(id(), { 'x-fragment-crc32': (crc32(PAYLOAD) ^ 1) >>> 0 })],
    deadLetters: ['crc-mismatch'],
    storesNothing: true,
  },
  {
    name: 'fragment: body over maxFragmentBytes',
    channel: 'reassemble',
    messages: ({ id }) => [single(id(), bytes(BUDGETS.maxFragmentBytes + 1, 9))],
    deadLetters: ['fragment-too-large'],
    storesNothing: true,
  },
  {
    name: 'fragment: user headers over maxHeaderBytes',
    channel: 'reassemble',
    messages: ({ id }) => [spoilt(id(), { 'x-padding': 'p'.repeat(BUDGETS.maxHeaderBytes + 1) })],
    deadLetters: ['headers-too-large'],
    storesNothing: true,
  },
  {
    name: 'fragment: the payload does not match its SHA-256',
    channel: 'reassemble',
    messages: ({ id }) => [spoilt(id(), { 'x-sequence-sha256': sha256Hex(Buffer.from('other')) })],
    deadLetters: ['integrity-mismatch'],
  },
  {
    name: 'sequence: more body bytes than x-sequence-bytes declares',
    channel: 'reassemble',
    messages: ({ id }) => [spoilt(id(), { 'x-sequence-bytes': PAYLOAD.length - 1 })],
    deadLetters: ['declaration-changed'],
  },
  {
    name: 'sequence: declares more bytes than maxSequenceBytes',
    channel: 'reassemble',
    messages: ({ id }) => [firstOf(id(), 3, KiB, BUDGETS.maxSequenceBytes + 1)],
    deadLetters: ['sequence-too-large'],
    storesNothing: true,
  },
  {
    name: 'sequence: declares more fragments than maxFragments',
    channel: 'reassemble',
    messages: ({ id }) => [firstOf(id(), BUDGETS.maxFragments + 1, 16)],
    deadLetters: ['too-many-fragments'],
    storesNothing: true,
  },
  {
    name: 'sequence: x-sequence-size changes',
    channel: 'reassemble',
    messages: ({ id }) => {
      const [first, second] = makeFragments(id(), bytes(3 * KiB, 4), KiB);
      return [first, { ...second, headers: { ...second.headers, 'x-sequence-size': 4 } }];
    },
    deadLetters: ['size-changed'],
    afterSweep: ['sequence-expired'],
  },
  {
    name: 'sequence: x-sequence-bytes changes',
    channel: 'reassemble',
    messages: ({ id }) => {
      const [first, second] = makeFragments(id(), bytes(3 * KiB, 4), KiB);
      return [first, { ...second, headers: { ...second.headers, 'x-sequence-bytes': 4 * KiB } }];
    },
    deadLetters: ['declaration-changed'],
    afterSweep: ['sequence-expired'],
  },
  {
    name: 'sequence: a second last fragment at another position',
    channel: 'reassemble',
    messages: ({ id }) => {
      const sequenceId = id();
      const last = makeStreamingFragments(sequenceId, bytes(3 * KiB, 6), KiB)[2];
      const otherLast = makeStreamingFragments(sequenceId, bytes(2 * KiB, 60), KiB)[1];
      return [last, otherLast];
    },
    deadLetters: ['duplicate-last'],
    afterSweep: ['sequence-expired'],
  },
  {
    name: 'sequence: a position beyond the size an earlier fragment declared',
    channel: 'reassemble',
    messages: ({ id }) => {
      const fragments = makeFragments(id(), bytes(3 * KiB, 7), KiB);
      const stray = makeStreamingFragments(id('stray'), bytes(8 * KiB, 7), KiB)[6];
      return [
        fragments[0],
        {
          ...stray,
          headers: { ...stray.headers, 'x-sequence-id': fragments[0].headers['x-sequence-id'] },
        },
      ];
    },
    deadLetters: ['position-out-of-range'],
    afterSweep: ['sequence-expired'],
  },
  {
    name: 'sequence: a stored position again with another body',
    channel: 'reassemble',
    messages: ({ id }) => {
      const sequenceId = id();
      const [first] = makeFragments(sequenceId, bytes(3 * KiB, 8), KiB);
      const [conflicting] = makeFragments(sequenceId, bytes(3 * KiB, 9), KiB);
      return [first, conflicting];
    },
    deadLetters: ['conflicting-duplicate'],
    afterSweep: ['sequence-expired'],
  },
  {
    name: 'sequence: 200 first fragments over maxSequenceBytes leave no marker',
    channel: 'reassemble',
    messages: ({ id }) =>
      Array.from({ length: 200 }, (_, i) =>
        firstOf(id(`${i}`), 2, 16, BUDGETS.maxSequenceBytes + 1),
      ),
    deadLetters: Array<RejectionCode>(200).fill('sequence-too-large'),
    storesNothing: true,
  },
  {
    name: 'flood: empty fragments of never-ending streamed sequences are charged and back-pressured',
    channel: 'reassemble',
    // 1 KiB + 128 bytes each against the channel's 512 KiB: about 450 fit at once.
    messages: ({ id }) => Array.from({ length: 600 }, (_, i) => emptyStreamed(id(`${i}`))),
    deadLetters: [],
    afterSweep: Array<RejectionCode>(600).fill('sequence-expired'),
    backpressure: true,
  },
  {
    name: 'flood: declared bytes squat one channel without starving another',
    channel: 'reassemble',
    // Each reserves 256 KiB when it opens: one fills the channel's 512 KiB share. Together they
    // declare 5 MiB, more than the store's 4 MiB: without the share they would starve the others.
    messages: ({ id }) => Array.from({ length: 20 }, (_, i) => firstOf(id(`${i}`), 4, 64 * KiB)),
    deadLetters: [],
    afterSweep: Array<RejectionCode>(20).fill('sequence-expired'),
    backpressure: true,
  },
];

const streamCases: HostileCase[] = [
  {
    name: 'stream: body does not match its CRC-32',
    channel: 'stream',
    messages: ({ id }) => [spoilt(id(), { 'x-fragment-crc32': 0 })],
    deadLetters: ['crc-mismatch'],
    storesNothing: true,
  },
  {
    name: 'stream: the last fragment fails the SHA-256',
    channel: 'stream',
    messages: ({ id }) => {
      const fragments = makeFragments(id(), bytes(3 * KiB, 10), KiB);
      const last = fragments[2];
      return [
        ...fragments.slice(0, 2),
        { ...last, headers: { ...last.headers, 'x-sequence-sha256': sha256Hex(Buffer.from('x')) } },
      ];
    },
    deadLetters: ['integrity-mismatch'],
    partialStreamAllowed: true,
  },
  {
    name: 'stream: a fragment whose body is a claim ticket',
    channel: 'stream',
    messages: ({ id }) => [spoilt(id(), { 'x-claim-check': 1 })],
    deadLetters: ['malformed-header'],
    storesNothing: true,
  },
  {
    name: 'stream: declares more bytes than maxSequenceBytes',
    channel: 'stream',
    messages: ({ id }) => [firstOf(id(), 3, KiB, BUDGETS.maxSequenceBytes + 1)],
    deadLetters: ['sequence-too-large'],
    storesNothing: true,
  },
];

const claimCases: HostileCase[] = [
  {
    name: 'claim check: x-sequence-position alone is a fragment, never a whole payload',
    channel: 'claim',
    messages: () => [{ body: PAYLOAD, headers: { 'x-sequence-position': 1 } }],
    deadLetters: ['malformed-header'],
    storesNothing: true,
  },
  {
    name: 'claim check: a fragment without x-sequence-id',
    channel: 'claim',
    messages: ({ id }) => [spoilt(id(), { 'x-sequence-id': undefined })],
    deadLetters: ['malformed-header'],
    storesNothing: true,
  },
  {
    name: 'claim check: x-fragment-crc32 alone',
    channel: 'claim',
    messages: () => [{ body: PAYLOAD, headers: { 'X-Fragment-CRC32': crc32(PAYLOAD) } }],
    deadLetters: ['malformed-header'],
    storesNothing: true,
  },
  {
    name: 'claim check: x-claim-check 2',
    channel: 'claim',
    messages: () => [{ body: PAYLOAD, headers: { 'x-claim-check': 2 } }],
    deadLetters: ['malformed-header'],
  },
  {
    name: 'claim check: a ticket that is not JSON',
    channel: 'claim',
    messages: () => [ticketMessage(Buffer.from('{"v":2,'))],
    deadLetters: ['claim-ticket-invalid'],
  },
  {
    name: 'claim check: a ticket over 8 KiB',
    channel: 'claim',
    messages: () => [ticketMessage(Buffer.from(JSON.stringify({ pad: 'p'.repeat(9 * KiB) })))],
    deadLetters: ['claim-ticket-invalid'],
  },
  {
    name: 'claim check: a tampered ticket',
    channel: 'claim',
    messages: async (context) => {
      const ticket = await parkedTicket(context, context.app.channels.claim);
      return [ticketMessage({ ...ticket, bytes: ticket.bytes + 1 })];
    },
    deadLetters: ['claim-ticket-invalid'],
  },
  {
    name: 'claim check: an expired ticket',
    channel: 'claim',
    messages: ({ app }) => [
      ticketMessage(
        signTicket(
          {
            store: app.target === 'embedded' ? 'filesystem' : 'redis',
            ref: 'a'.repeat(32),
            bytes: 1,
            sha256: sha256Hex(Buffer.from('x')),
            expiresAt: Date.now() - 1,
            audience: [app.channels.claim],
          },
          keyring(),
        ),
      ),
    ],
    deadLetters: ['claim-ticket-invalid'],
  },
  {
    name: 'claim check: a ticket signed with a key the consumer does not hold',
    channel: 'claim',
    messages: async (context) => {
      const real = await parkedTicket(context, context.app.channels.claim);
      const { v: _v, kid: _kid, sig: _sig, ...fields } = real;
      return [
        ticketMessage(
          signTicket({ ...fields, audience: [...real.audience!] }, keyring(FORGER_KEYS)),
        ),
      ];
    },
    deadLetters: ['claim-ticket-invalid'],
  },
  {
    name: 'claim check: a ticket replayed on a channel it was not issued for',
    channel: 'claim',
    messages: async (context) => [ticketMessage(await parkedTicket(context, 'adv.elsewhere'))],
    deadLetters: ['wrong-audience'],
  },
  {
    name: 'claim check: a ticket naming a store the consumer lacks',
    channel: 'claim',
    messages: ({ app }) => [
      ticketMessage(
        signTicket(
          {
            store: 'archive-eu',
            ref: 'a'.repeat(32),
            bytes: 1,
            sha256: sha256Hex(Buffer.from('x')),
            expiresAt: Date.now() + 600_000,
            audience: [app.channels.claim],
          },
          keyring(),
        ),
      ),
    ],
    deadLetters: ['unknown-payload-store'],
  },
  {
    name: 'claim check: a ticket whose payload is gone',
    channel: 'claim',
    messages: async (context) => {
      const ticket = await parkedTicket(context, context.app.channels.claim);
      await context.app.claimCheck.release(ticket);
      return [ticketMessage(ticket)];
    },
    deadLetters: ['claim-check-not-found'],
  },
];

const resequencerCases: HostileCase[] = [
  ['key missing', () => ({ [ResequenceHeader.seq]: 1 })],
  ['seq missing', (key: string) => ({ [ResequenceHeader.key]: key })],
  [
    'seq not an integer',
    (key: string) => ({ [ResequenceHeader.key]: key, [ResequenceHeader.seq]: 1.5 }),
  ],
  ['seq negative', (key: string) => ({ [ResequenceHeader.key]: key, [ResequenceHeader.seq]: -1 })],
  ['seq "NaN"', (key: string) => ({ [ResequenceHeader.key]: key, [ResequenceHeader.seq]: 'NaN' })],
  ['seq 2^53', (key: string) => ({ [ResequenceHeader.key]: key, [ResequenceHeader.seq]: 2 ** 53 })],
  [
    'key with control characters',
    (key: string) => ({ [ResequenceHeader.key]: `${key}\u0007\n`, [ResequenceHeader.seq]: 1 }),
  ],
  [
    'key of 257 characters',
    () => ({ [ResequenceHeader.key]: 'k'.repeat(257), [ResequenceHeader.seq]: 1 }),
  ],
  [
    'key as a table',
    (key: string) => ({ [ResequenceHeader.key]: { key }, [ResequenceHeader.seq]: 1 }),
  ],
  [
    'seq as an array',
    (key: string) => ({ [ResequenceHeader.key]: key, [ResequenceHeader.seq]: [1] }),
  ],
  [
    'a fragment of a Message Sequence',
    (key: string) => ({
      ...single(key).headers,
      [ResequenceHeader.key]: key,
      [ResequenceHeader.seq]: 1,
    }),
  ],
  [
    'a claim ticket',
    (key: string) => ({
      'x-claim-check': 1,
      [ResequenceHeader.key]: key,
      [ResequenceHeader.seq]: 1,
    }),
  ],
].map(([name, build]) => ({
  name: `resequencer: ${name as string}`,
  channel: 'resequenced' as const,
  messages: ({ id }: CaseContext) => [
    resequenced((build as (key: string) => Record<string, unknown>)(id())),
  ],
  deadLetters: ['invalid-resequence-event' as const],
  storesNothing: true,
}));

resequencerCases.push({
  name: 'resequencer: bodies past maxBufferedBytesPerKey behind a gap',
  channel: 'resequenced',
  messages: ({ id }) => {
    const key = id();
    // 40 KiB each against 64 KiB per key: seq 2 is buffered, 3 would pass the budget.
    return [2, 3].map((seq) =>
      resequenced(
        { [ResequenceHeader.key]: key, [ResequenceHeader.seq]: seq },
        bytes(40 * KiB, seq),
      ),
    );
  },
  deadLetters: ['resequencer-buffer-full'],
  afterSweep: ['resequencer-gap-dead-letter'],
});

const inboxCases: HostileCase[] = [
  {
    name: 'inbox: an id with control characters',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(event(`${id()}\u0000\u001b`))],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: a lone surrogate in a field',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(event(id(), { aggregateId: LONE_SURROGATE }))],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: a type no handler takes',
    channel: 'inbox',
    messages: ({ id }) => [
      inboxMessage(event(id(), { type: 'Unknown' }), { [MESSAGE_TYPE_HEADER]: 'Unknown' }),
    ],
    deadLetters: ['no-inbox-handler'],
  },
  {
    name: 'inbox: a body that is not JSON',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(Buffer.from([0xff, 0x00, 0x7b]), {}, id())],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: x-message-id differs from the body',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(event(id()), {}, id('other'))],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: no x-message-kind',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(event(id()), { [MESSAGE_KIND_HEADER]: undefined })],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: a null payload',
    channel: 'inbox',
    messages: ({ id }) => [inboxMessage(event(id(), { payload: null }))],
    deadLetters: ['invalid-inbox-message'],
  },
  {
    name: 'inbox: x-message-id as a Buffer',
    channel: 'inbox',
    messages: ({ id }) => {
      const messageId = id();
      return [inboxMessage(event(messageId), {}, Buffer.from(messageId) as unknown as string)];
    },
    deadLetters: ['invalid-inbox-message'],
  },
];

export const CATALOGUE: readonly HostileCase[] = [
  ...sequenceCases,
  ...streamCases,
  ...claimCases,
  ...resequencerCases,
  ...inboxCases,
];
