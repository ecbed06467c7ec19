import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ClaimTicketKeyring } from '../../src/core/claim-ticket-keyring';
import {
  signTicket,
  ticketFragmentProblem,
  ticketSigningInput,
  verifyTicket,
} from '../../src/core/claim-ticket';

/** The HMAC-SHA256 of `input`'s UTF-8 bytes under `secret`'s, in base64url: made by hand. */
function hmac(secret: string, input: string): string {
  return createHmac('sha256', Buffer.from(secret, 'utf8'))
    .update(Buffer.from(input, 'utf8'))
    .digest('base64url');
}

/**
 * docs/wire-contract.md gives programs in other languages a ticket signing check per version (a
 * whole payload's, `v: 2`, and a fragment's, `v: 3`): its signing input and `sig` must be what
 * the library builds and verifies.
 */
describe('docs/wire-contract.md', () => {
  const doc = readFileSync(join(__dirname, '../../../../docs/wire-contract.md'), 'utf8');
  const checks = [...doc.matchAll(/^signing input: (.+)\nsig: +(\S+)$/gm)].map(
    ([, input, sig]) => ({ input, sig }),
  );
  const keyId = /with key `([^`]+)` whose/.exec(doc)?.[1];
  const secret = /secret is the UTF-8 of `([^`]+)`/.exec(doc)?.[1];

  it('gives a signing check for v 2 and for v 3, under a key it names', () => {
    expect({ keyId, secret }).toEqual({ keyId: 'k-2026', secret: expect.any(String) });
    expect(checks.map(({ input }) => (JSON.parse(input) as unknown[])[1])).toEqual([2, 3]);
  });

  it("gives a ticket signing check that the library's verifyTicket accepts, input byte for byte", () => {
    const { input, sig } = checks[0];
    const [, v, kid, store, ref, bytes, sha256, contentType, expiresAt, audience] = JSON.parse(
      input,
    ) as [string, number, string, string, string, number, string, null, number, string[]];
    const body = { v, store, ref, bytes, sha256, contentType, expiresAt, audience, kid, sig };
    const keys = new ClaimTicketKeyring([{ id: keyId!, secret: secret! }]);

    const ticket = verifyTicket(body, keys, expiresAt - 1);

    expect(ticketSigningInput(ticket)).toBe(input);
    expect(hmac(secret!, input)).toBe(sig);
  });

  it("gives a fragment's (v 3) check: the library signs those fields to that input and sig", () => {
    const { input, sig } = checks[1];
    // Fixed here, not read from the doc: the doc's check must be of these.
    const fields = {
      store: 's3',
      ref: 'r-2',
      bytes: 65_536,
      sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
      expiresAt: 1_798_761_600_000,
      audience: ['fragment of imaging.zürich'],
      sequenceId: 'scan-42',
      position: 2,
    };
    const keys = new ClaimTicketKeyring([{ id: 'k-2026', secret: secret! }]);
    // The array as the doc specifies it, written out as a producer in another language would.
    expect(input).toBe(
      '["nest-sequence/claim-ticket",3,"k-2026","s3","r-2",65536,' +
        `"${fields.sha256}",null,1798761600000,["fragment of imaging.zürich"],"scan-42",2]`,
    );
    expect(hmac(secret!, input)).toBe(sig);

    const ticket = signTicket(fields, keys);

    expect(ticket).toMatchObject({ v: 3, kid: 'k-2026', sig });
    expect(ticketSigningInput(ticket)).toBe(input);
    const body = JSON.parse(JSON.stringify(ticket)) as Record<string, unknown>;
    expect(verifyTicket(body, keys, fields.expiresAt - 1)).toEqual(ticket);
    expect(ticketFragmentProblem(ticket, { sequenceId: 'scan-42', position: 2 })).toBeUndefined();
    expect(ticketFragmentProblem(ticket, { sequenceId: 'scan-42', position: 1 })).toBeDefined();
  });
});
