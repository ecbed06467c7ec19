import { createHmac } from 'node:crypto';
import { inspect } from 'node:util';
import {
  checkTicketAudience,
  fragmentAudience,
  type ClaimTicket,
  type ClaimTicketFields,
  MAX_TICKET_BODY_BYTES,
  parseTicketBody,
  serializeTicket,
  signTicket,
  ticketFragmentProblem,
  ticketSigningInput,
  verifyTicket,
} from './claim-ticket';
import { ClaimTicketKeyring } from './claim-ticket-keyring';
import {
  ClaimTicketInvalidError,
  type ClaimTicketInvalidReason,
} from './errors/claim-ticket-invalid.error';
import { ClaimTicketAudienceError } from './errors/claim-ticket-audience.error';
import { SequenceOptionsError } from './errors/sequence-options.error';

const NOW = Date.UTC(2026, 10, 1, 12, 0, 0);
const SECRET_A = Buffer.alloc(32, 0xa1);
const SECRET_B = 'b'.repeat(32);
const keysA = new ClaimTicketKeyring([{ id: 'key-a', secret: SECRET_A }]);

const fields: ClaimTicketFields = {
  store: 'filesystem',
  ref: '2026/11/01/3f1c9e0a-payload',
  bytes: 1_048_576,
  sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
  contentType: 'application/dicom',
  expiresAt: NOW + 60_000,
  audience: ['imaging.archive'],
};

/** The ticket as a receiver gets it: parsed from the JSON body, a plain mutable object. */
function wire(ticket: ClaimTicket): Record<string, unknown> {
  return parseTicketBody(serializeTicket(ticket)) as Record<string, unknown>;
}

function refusal(run: () => unknown): ClaimTicketInvalidError {
  try {
    run();
  } catch (error) {
    if (error instanceof ClaimTicketInvalidError) return error;
    throw error;
  }
  throw new Error('expected a ClaimTicketInvalidError, but nothing was thrown');
}

function reasonFor(candidate: unknown, keys = keysA, now = NOW): ClaimTicketInvalidReason {
  return refusal(() => verifyTicket(candidate, keys, now)).reason;
}

describe('claim tickets', () => {
  describe('signing and verifying', () => {
    it('verifies a ticket it signed, returning the same fields', () => {
      const ticket = signTicket(fields, keysA);

      expect(verifyTicket(wire(ticket), keysA, NOW)).toEqual({
        v: 2,
        ...fields,
        kid: 'key-a',
        sig: ticket.sig,
      });
    });

    it("binds a fragment's ticket to the fragments of its channel only", () => {
      const channel = 'c'.repeat(255);
      const ticket = signTicket({ ...fields, audience: [fragmentAudience(channel)] }, keysA);

      expect(() => checkTicketAudience(ticket, fragmentAudience(channel), false)).not.toThrow();
      expect(() => checkTicketAudience(ticket, channel, false)).toThrow(ClaimTicketAudienceError);
    });

    it('signs with an HMAC-SHA256 of the canonical input, base64url without padding', () => {
      const ticket = signTicket(fields, keysA);
      const expected = createHmac('sha256', SECRET_A)
        .update(
          JSON.stringify([
            'nest-sequence/claim-ticket',
            2,
            'key-a',
            fields.store,
            fields.ref,
            fields.bytes,
            fields.sha256,
            fields.contentType,
            fields.expiresAt,
            fields.audience,
          ]),
        )
        .digest('base64url');

      expect(ticket.sig).toBe(expected);
      expect(ticket.sig).toMatch(/^[A-Za-z0-9_-]{43}$/);
    });

    it('puts null in the signing input for an absent contentType, so it cannot be added later', () => {
      const { contentType: _omitted, ...bare } = fields;
      const ticket = signTicket(bare, keysA);

      expect(ticket).not.toHaveProperty('contentType');
      expect(JSON.parse(ticketSigningInput(ticket))).toContain(null);
      expect(verifyTicket(wire(ticket), keysA, NOW)).toEqual(ticket);
      expect(reasonFor({ ...wire(ticket), contentType: 'text/plain' })).toBe('bad-signature');
    });

    it('takes a contentType written as null in the body for an absent one', () => {
      const { contentType: _omitted, ...bare } = fields;
      const ticket = signTicket(bare, keysA);

      expect(verifyTicket({ ...wire(ticket), contentType: null }, keysA, NOW)).toEqual(ticket);
    });

    it('returns a frozen ticket that holds the ticket fields only', () => {
      const verified = verifyTicket(wire(signTicket(fields, keysA)), keysA, NOW);

      expect(Object.isFrozen(verified)).toBe(true);
      expect(Object.keys(verified).sort()).toEqual(
        [
          'audience',
          'bytes',
          'contentType',
          'expiresAt',
          'kid',
          'ref',
          'sha256',
          'sig',
          'store',
          'v',
        ].sort(),
      );
    });

    it('refuses to sign fields that a receiver would refuse', () => {
      const error = refusal(() => signTicket({ ...fields, sha256: 'ABC' }, keysA));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toMatch(/sha256/);
    });
  });

  describe('tampering', () => {
    const signed = wire(signTicket(fields, keysA));
    const tampered: Array<[string, unknown]> = [
      ['store', 'redis'],
      ['ref', '2026/11/01/another-payload'],
      ['bytes', fields.bytes + 1],
      ['sha256', 'f'.repeat(64)],
      ['contentType', 'text/html'],
      ['expiresAt', fields.expiresAt + 3_600_000],
      ['audience', ['imaging.billing']],
      ['audience', ['imaging.archive', 'imaging.billing']],
      ['audience', []],
    ];

    it.each(tampered)('refuses a ticket whose %s was changed after signing', (field, value) => {
      expect(reasonFor({ ...signed, [field]: value })).toBe('bad-signature');
    });

    it('refuses another spelling of the same signature (the unused bits of its last character)', () => {
      const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
      const sig = String(signed.sig);
      const last = alphabet[alphabet.indexOf(sig[42]) ^ 1];
      const respelled = sig.slice(0, 42) + last;
      expect(Buffer.from(respelled, 'base64url').equals(Buffer.from(sig, 'base64url'))).toBe(true);

      expect(reasonFor({ ...signed, sig: respelled })).toBe('bad-signature');
    });

    it('refuses a ticket whose contentType was removed after signing', () => {
      const { contentType: _removed, ...rest } = signed;

      expect(reasonFor(rest)).toBe('bad-signature');
      expect(reasonFor({ ...signed, contentType: null })).toBe('bad-signature');
    });

    it('refuses a ticket whose kid was switched to another key it holds', () => {
      const both = new ClaimTicketKeyring([
        { id: 'key-a', secret: SECRET_A },
        { id: 'key-b', secret: SECRET_B },
      ]);

      expect(reasonFor({ ...signed, kid: 'key-b' }, both)).toBe('bad-signature');
    });

    it('refuses a ticket whose sig was changed by one character', () => {
      const sig = signed.sig as string;
      const flipped = (sig[0] === 'A' ? 'B' : 'A') + sig.slice(1);

      expect(reasonFor({ ...signed, sig: flipped })).toBe('bad-signature');
    });

    it('refuses a sig that is not 43 base64url characters, even if it decodes to the MAC', () => {
      const sig = signed.sig as string;

      expect(reasonFor({ ...signed, sig: `${sig}=` })).toBe('bad-signature');
      expect(reasonFor({ ...signed, sig: `${sig.slice(0, 20)}!${sig.slice(20)}` })).toBe(
        'bad-signature',
      );
    });

    it('refuses a ticket signed with another secret under the same key id', () => {
      const impostor = new ClaimTicketKeyring([{ id: 'key-a', secret: SECRET_B }]);

      expect(reasonFor(wire(signTicket(fields, impostor)))).toBe('bad-signature');
    });
  });

  describe('unsigned, unknown key and expiry', () => {
    it.each([
      ['without sig', undefined],
      ['with a null sig', null],
      ['with an empty sig', ''],
    ])('refuses a ticket %s as unsigned', (_case, sig) => {
      const ticket = { ...wire(signTicket(fields, keysA)), sig };

      expect(reasonFor(ticket)).toBe('unsigned');
    });

    it('refuses a DESIGN.md-style ticket without v, kid and sig as unsigned', () => {
      expect(reasonFor({ ...fields })).toBe('unsigned');
    });

    it('refuses a ticket signed with a key id it does not hold, without trying its keys', () => {
      const other = new ClaimTicketKeyring([{ id: 'key-z', secret: SECRET_A }]);
      // Same secret, other id: it would verify if the receiver tried every key it holds.
      const error = refusal(() => verifyTicket(wire(signTicket(fields, other)), keysA, NOW));

      expect(error.reason).toBe('unknown-key');
      expect(error.kid).toBe('key-z');
    });

    it('refuses a ticket at its expiresAt instant', () => {
      const ticket = wire(signTicket(fields, keysA));

      expect(reasonFor(ticket, keysA, fields.expiresAt)).toBe('expired');
      expect(verifyTicket(ticket, keysA, fields.expiresAt - 1).expiresAt).toBe(fields.expiresAt);
    });

    it('throws instead of treating a NaN now as never expired', () => {
      expect(() => verifyTicket(wire(signTicket(fields, keysA)), keysA, Number.NaN)).toThrow(
        RangeError,
      );
    });

    it('reports a bad signature before expiry, so an expired forgery is called a forgery', () => {
      const forged = { ...wire(signTicket(fields, keysA)), ref: 'elsewhere' };

      expect(reasonFor(forged, keysA, fields.expiresAt + 1)).toBe('bad-signature');
    });
  });

  describe('key rotation', () => {
    const keyA = { id: 'key-a', secret: SECRET_A };
    const keyB = { id: 'key-b', secret: SECRET_B };

    it('signs with the first key', () => {
      const ticket = signTicket(fields, new ClaimTicketKeyring([keyB, keyA]));

      expect(ticket.kid).toBe('key-b');
    });

    it('verifies a ticket signed by a key that is now second in the list', () => {
      const before = wire(signTicket(fields, new ClaimTicketKeyring([keyB])));
      const afterRotation = new ClaimTicketKeyring([keyA, keyB]);

      expect(verifyTicket(before, afterRotation, NOW).kid).toBe('key-b');
    });

    it('refuses a ticket of a retired key once that key is removed', () => {
      const before = wire(signTicket(fields, new ClaimTicketKeyring([keyB])));

      expect(reasonFor(before, new ClaimTicketKeyring([keyA]))).toBe('unknown-key');
    });
  });

  describe('audience', () => {
    /** A ticket as releases before audiences wrote it: `v: 1`, signed without an audience. */
    function legacyTicket(keys = keysA): Record<string, unknown> {
      const { audience: _audience, ...rest } = fields;
      const unsigned = { v: 1 as const, ...rest, kid: 'key-a' };
      const sig = keys.hmac('key-a', ticketSigningInput(unsigned))!.toString('base64url');
      return { ...unsigned, sig };
    }

    it('takes a ticket on a channel of its audience', () => {
      const ticket = signTicket({ ...fields, audience: ['a', 'b'] }, keysA);

      expect(() => checkTicketAudience(ticket, 'a', false)).not.toThrow();
      expect(() => checkTicketAudience(ticket, 'b', false)).not.toThrow();
    });

    it('refuses a ticket on a channel it was not issued for, naming both', () => {
      const ticket = verifyTicket(wire(signTicket(fields, keysA)), keysA, NOW);

      const error = (() => {
        try {
          checkTicketAudience(ticket, 'imaging.billing', true);
        } catch (caught) {
          return caught;
        }
      })();
      expect(error).toBeInstanceOf(ClaimTicketAudienceError);
      expect(error).toMatchObject({
        code: 'wrong-audience',
        channel: 'imaging.billing',
        audience: ['imaging.archive'],
        kid: 'key-a',
      });
    });

    it('refuses a ticket with an empty audience on every channel', () => {
      const byHand = signTicket({ ...fields, audience: [] }, keysA);

      expect(() => checkTicketAudience(byHand, 'imaging.archive', true)).toThrow(
        ClaimTicketAudienceError,
      );
    });

    it('verifies a version 1 ticket, which has no audience', () => {
      const ticket = verifyTicket(legacyTicket(), keysA, NOW);

      expect(ticket.v).toBe(1);
      expect(ticket).not.toHaveProperty('audience');
    });

    it('refuses a version 1 ticket on a channel unless tickets without audience are accepted', () => {
      const ticket = verifyTicket(legacyTicket(), keysA, NOW);

      expect(refusal(() => checkTicketAudience(ticket, 'imaging.archive', false)).reason).toBe(
        'no-audience',
      );
      expect(() => checkTicketAudience(ticket, 'imaging.archive', true)).not.toThrow();
    });

    it('refuses a version 2 ticket stripped of its audience and relabelled version 1', () => {
      const { audience: _audience, ...stripped } = wire(signTicket(fields, keysA));

      expect(reasonFor({ ...stripped, v: 1 })).toBe('bad-signature');
    });

    it('refuses a version 1 ticket that carries an audience', () => {
      const error = refusal(() =>
        verifyTicket({ ...legacyTicket(), audience: ['imaging.archive'] }, keysA, NOW),
      );

      expect(error.reason).toBe('malformed');
      expect(error.detail).toContain('audience');
    });

    it('refuses to sign an audience that would not fit in a ticket', () => {
      const audience = Array.from({ length: 40 }, (_, i) => `${i}.${'c'.repeat(250)}`);
      const error = refusal(() => signTicket({ ...fields, audience }, keysA));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toMatch(/bytes, over the 8192-byte limit/);
    });
  });

  describe("a fragment's ticket", () => {
    const fragment = { sequenceId: 'study-1', position: 2 };
    const bound = () => signTicket({ ...fields, ...fragment }, keysA);

    it('is version 3, names its fragment and signs it after the audience', () => {
      const ticket = bound();

      expect(verifyTicket(wire(ticket), keysA, NOW)).toMatchObject({ v: 3, ...fragment });
      expect(JSON.parse(ticketSigningInput(ticket))).toEqual([
        'nest-sequence/claim-ticket',
        3,
        'key-a',
        fields.store,
        fields.ref,
        fields.bytes,
        fields.sha256,
        fields.contentType,
        fields.expiresAt,
        fields.audience,
        'study-1',
        2,
      ]);
    });

    it.each([
      ['another sequence', { sequenceId: 'study-2' }],
      ['another position', { position: 1 }],
    ])('refuses a ticket whose fragment was changed to %s after signing', (_label, change) => {
      expect(reasonFor({ ...wire(bound()), ...change })).toBe('bad-signature');
    });

    it('refuses a ticket stripped of its fragment and relabelled version 2', () => {
      const { sequenceId: _id, position: _position, ...stripped } = wire(bound());

      expect(reasonFor({ ...stripped, v: 2 })).toBe('bad-signature');
    });

    it.each([
      [
        'a version 2 ticket that names a fragment',
        { ...wire(signTicket(fields, keysA)), ...fragment },
      ],
      ['a version 3 ticket without a position', { ...wire(bound()), position: undefined }],
      ['a sequence id the wire contract refuses', { ...wire(bound()), sequenceId: 'a b' }],
      ['position 0', { ...wire(bound()), position: 0 }],
    ])('refuses %s as malformed', (_label, candidate) => {
      expect(reasonFor(candidate)).toBe('malformed');
    });

    it('is refused under the headers of another fragment, naming both', () => {
      expect(ticketFragmentProblem(bound(), fragment)).toBeUndefined();
      expect(ticketFragmentProblem(bound(), { sequenceId: 'study-1', position: 3 })).toBe(
        'the ticket was issued for sequence study-1 fragment 2, not for sequence study-1 fragment 3',
      );
    });

    it('of version 2, naming no fragment, is taken under any fragment headers', () => {
      expect(ticketFragmentProblem(signTicket(fields, keysA), fragment)).toBeUndefined();
    });
  });

  describe('shape', () => {
    const signed = wire(signTicket(fields, keysA));
    const bad: Array<[string, string, unknown]> = [
      ['v', 'another version', 4],
      ['v', 'a string version', '1'],
      ['store', 'an empty store', ''],
      ['store', 'a store name with a slash', 'file/system'],
      ['store', 'a store name over 64 characters', 's'.repeat(65)],
      ['ref', 'an empty ref', ''],
      ['ref', 'a ref over 512 characters', 'r'.repeat(513)],
      ['ref', 'a numeric ref', 42],
      ['bytes', 'negative bytes', -1],
      ['bytes', 'fractional bytes', 1.5],
      ['bytes', 'bytes beyond the safe integers', 2 ** 53],
      ['bytes', 'bytes as a string', '10'],
      ['sha256', 'uppercase sha256', 'E'.repeat(64)],
      ['sha256', 'a 63-digit sha256', 'e'.repeat(63)],
      ['contentType', 'a contentType with a newline', 'text/plain\nx-injected: 1'],
      ['expiresAt', 'an infinite expiresAt', Infinity],
      ['expiresAt', 'a fractional expiresAt', NOW + 0.5],
      ['expiresAt', 'a string expiresAt', String(NOW)],
      ['expiresAt', 'an expiresAt past the last instant a Date holds', 8.64e15 + 1],
      ['expiresAt', 'the largest safe integer as expiresAt', Number.MAX_SAFE_INTEGER],
      ['kid', 'a kid with a space', 'key a'],
      ['kid', 'a missing kid', undefined],
      ['sig', 'a numeric sig', 7],
      ['audience', 'a missing audience', undefined],
      ['audience', 'a string audience', 'imaging.archive'],
      ['audience', 'an audience with an empty channel', ['']],
      ['audience', 'an audience with a numeric channel', [7]],
      ['audience', 'an audience with a channel over 255 characters', ['c'.repeat(256)]],
      ['audience', "an audience with a fragment's entry of no channel", [fragmentAudience('')]],
      [
        'audience',
        "a fragment's entry of a channel over 255 characters",
        [fragmentAudience('c'.repeat(256))],
      ],
      ['audience', 'an audience naming a channel twice', ['a', 'a']],
    ];

    it.each(bad)('refuses a ticket whose %s is %s as malformed', (field, _case, value) => {
      const error = refusal(() => verifyTicket({ ...signed, [field]: value }, keysA, NOW));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toContain(field);
    });

    it('refuses a ticket with a field the format does not have', () => {
      const error = refusal(() => verifyTicket({ ...signed, note: 'hi' }, keysA, NOW));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toContain('"note"');
    });

    it('refuses a ticket carrying a __proto__ key', () => {
      const candidate = parseTicketBody(
        Buffer.from(JSON.stringify(signed).replace('{', '{"__proto__":{"polluted":true},')),
      );

      expect(reasonFor(candidate)).toBe('malformed');
      expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    });

    it.each([
      ['null', null],
      ['an array', [signed]],
      ['a string', JSON.stringify(signed)],
    ])('refuses %s as malformed', (_case, candidate) => {
      expect(reasonFor(candidate)).toBe('malformed');
    });
  });

  describe('parseTicketBody', () => {
    it('parses a serialized ticket back to its fields', () => {
      const ticket = signTicket(fields, keysA);

      expect(parseTicketBody(serializeTicket(ticket))).toEqual(ticket);
    });

    it('refuses a body that is not JSON', () => {
      const error = refusal(() => parseTicketBody(Buffer.from('{"store": "filesystem",')));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toMatch(/JSON/);
    });

    it('refuses a body that is not UTF-8', () => {
      const error = refusal(() => parseTicketBody(Buffer.from([0x7b, 0xff, 0x7d])));

      expect(error.reason).toBe('malformed');
      expect(error.detail).toMatch(/UTF-8/);
    });

    it('refuses a body over the size limit before parsing it', () => {
      // Valid JSON: only the size can be the reason.
      const body = Buffer.from(JSON.stringify({ pad: 'x'.repeat(MAX_TICKET_BODY_BYTES) }));
      const parse = jest.spyOn(JSON, 'parse');
      try {
        const error = refusal(() => parseTicketBody(body));

        expect(error.reason).toBe('malformed');
        expect(error.detail).toMatch(/limit/);
        expect(parse).not.toHaveBeenCalled();
      } finally {
        parse.mockRestore();
      }
    });

    it('accepts a body of exactly the size limit', () => {
      const json = JSON.stringify({ pad: '' });
      const body = Buffer.from(
        json.replace('""', `"${'x'.repeat(MAX_TICKET_BODY_BYTES - json.length)}"`),
      );

      expect(body.length).toBe(MAX_TICKET_BODY_BYTES);
      expect(parseTicketBody(body)).toHaveProperty('pad');
    });
  });

  describe('keyring', () => {
    function problemsOf(run: () => unknown): readonly string[] {
      try {
        run();
      } catch (error) {
        if (error instanceof SequenceOptionsError) return error.problems;
        throw error;
      }
      throw new Error('expected a SequenceOptionsError');
    }

    it('refuses a secret shorter than 32 bytes', () => {
      const problems = problemsOf(
        () => new ClaimTicketKeyring([{ id: 'short', secret: Buffer.alloc(31) }]),
      );

      expect(problems).toEqual([expect.stringMatching(/key "short": secret is 31 bytes/)]);
    });

    it('measures a string secret in UTF-8 bytes', () => {
      // 16 characters, 32 bytes.
      expect(() => new ClaimTicketKeyring([{ id: 'utf8', secret: 'é'.repeat(16) }])).not.toThrow();
      expect(
        problemsOf(() => new ClaimTicketKeyring([{ id: 'ascii', secret: 'e'.repeat(31) }])),
      ).toHaveLength(1);
    });

    it('refuses an empty key list', () => {
      expect(problemsOf(() => new ClaimTicketKeyring([]))).toEqual([
        expect.stringMatching(/at least one key/),
      ]);
    });

    it('refuses two keys with one id, and a bad id, reporting both at once', () => {
      const problems = problemsOf(
        () =>
          new ClaimTicketKeyring([
            { id: 'same', secret: SECRET_A },
            { id: 'same', secret: SECRET_B },
            { id: 'not ok', secret: SECRET_A },
          ]),
      );

      expect(problems).toEqual([
        expect.stringMatching(/key "same": the id is used twice/),
        expect.stringMatching(/key "not ok": id must be/),
      ]);
    });

    it('keeps its own copy of a Buffer secret', () => {
      const secret = Buffer.alloc(32, 1);
      const keys = new ClaimTicketKeyring([{ id: 'k', secret }]);
      const ticket = wire(signTicket(fields, keys));
      secret.fill(2);

      expect(verifyTicket(ticket, keys, NOW).kid).toBe('k');
    });

    it('shows no secret to JSON.stringify or util.inspect', () => {
      const keys = new ClaimTicketKeyring([{ id: 'k', secret: 'super-secret-value-'.repeat(2) }]);

      const shown = [JSON.stringify(keys), inspect(keys, { showHidden: true, depth: 5 })];
      const asHex = Buffer.from('super')
        .toString('hex')
        .replace(/(..)(?!$)/g, '$1 ');

      for (const text of shown) {
        expect(text).toContain('signingKeyId');
        expect(text).not.toContain('super-secret');
        expect(text).not.toContain(asHex);
      }
    });
  });
});
