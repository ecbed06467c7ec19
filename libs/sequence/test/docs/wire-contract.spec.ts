import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ClaimTicketKeyring } from '../../src/core/claim-ticket-keyring';
import { ticketSigningInput, verifyTicket } from '../../src/core/claim-ticket';

/**
 * docs/wire-contract.md gives programs in other languages a ticket signing check: its signing
 * input and `sig` must be what the library builds and verifies.
 */
describe('docs/wire-contract.md', () => {
  const doc = readFileSync(join(__dirname, '../../../../docs/wire-contract.md'), 'utf8');
  const input = /^signing input: (.+)$/m.exec(doc)?.[1];
  const sig = /^sig: +(\S+)$/m.exec(doc)?.[1];
  const keyId = /with key `([^`]+)` whose/.exec(doc)?.[1];
  const secret = /secret is the UTF-8 of `([^`]+)`/.exec(doc)?.[1];

  it("gives a ticket signing check that the library's verifyTicket accepts, input byte for byte", () => {
    expect({ input, sig, keyId, secret }).toEqual({
      input: expect.any(String),
      sig: expect.any(String),
      keyId: expect.any(String),
      secret: expect.any(String),
    });
    const [, v, kid, store, ref, bytes, sha256, contentType, expiresAt, audience] = JSON.parse(
      input!,
    ) as [string, number, string, string, string, number, string, null, number, string[]];
    const body = { v, store, ref, bytes, sha256, contentType, expiresAt, audience, kid, sig };
    const keys = new ClaimTicketKeyring([{ id: keyId!, secret: secret! }]);

    const ticket = verifyTicket(body, keys, expiresAt - 1);

    expect(ticketSigningInput(ticket)).toBe(input);
  });
});
