import { createHmac } from 'node:crypto';
import { SequenceOptionsError } from './errors/sequence-options.error';

/** One claim ticket signing key. `secret` is a Buffer, or a string taken as its UTF-8 bytes. */
export interface ClaimTicketKey {
  /** Travels in tickets as `kid`: a name, never secret (1–64 of `[A-Za-z0-9._:-]`). */
  readonly id: string;
  /** At least 32 bytes (`MIN_TICKET_SECRET_BYTES`), e.g. `openssl rand -base64 32`. */
  readonly secret: Buffer | string;
}

/** HMAC-SHA256 keys shorter than its output would weaken it; shorter secrets are refused. */
export const MIN_TICKET_SECRET_BYTES = 32;
export const TICKET_KEY_ID_PATTERN = /^[A-Za-z0-9._:-]{1,64}$/;

/**
 * The keys claim tickets are signed and verified with, validated once. The first key signs;
 * every key verifies, so keys rotate: add the new key first, keep the old one listed until the
 * tickets it signed have expired, then remove it. Secrets are copied (later changes to the
 * caller's Buffers do not reach them) and kept in a private field: `JSON.stringify`,
 * `util.inspect` and loggers see the key ids only.
 */
export class ClaimTicketKeyring {
  /** The key new tickets are signed with: the first one given. */
  readonly signingKeyId: string;
  readonly keyIds: readonly string[];
  readonly #secrets: ReadonlyMap<string, Buffer>;

  /** @throws SequenceOptionsError listing every problem with the keys at once. */
  constructor(keys: readonly ClaimTicketKey[]) {
    const problems: string[] = [];
    const secrets = new Map<string, Buffer>();
    if (!Array.isArray(keys) || keys.length === 0) {
      problems.push('give at least one key: { id, secret } (the first signs, all verify)');
    } else {
      keys.forEach((key: Partial<ClaimTicketKey> | undefined, index) => {
        const id: unknown = key?.id;
        const label = typeof id === 'string' ? `key ${JSON.stringify(id)}` : `key #${index + 1}`;
        if (typeof id !== 'string' || !TICKET_KEY_ID_PATTERN.test(id)) {
          problems.push(`${label}: id must be 1-64 characters of [A-Za-z0-9._:-]`);
        } else if (secrets.has(id)) {
          problems.push(`${label}: the id is used twice; each key needs its own id`);
        }
        const secret = secretBytes(key?.secret);
        if (secret === undefined) {
          problems.push(`${label}: secret must be a Buffer or a string`);
        } else if (secret.length < MIN_TICKET_SECRET_BYTES) {
          problems.push(
            `${label}: secret is ${secret.length} bytes; use at least ${MIN_TICKET_SECRET_BYTES} ` +
              'random bytes (e.g. `openssl rand -base64 32`)',
          );
        }
        if (typeof id === 'string' && secret !== undefined && !secrets.has(id)) {
          secrets.set(id, secret);
        }
      });
    }
    if (problems.length > 0) throw new SequenceOptionsError('claim ticket keys', problems);
    this.#secrets = secrets;
    this.keyIds = Object.freeze([...secrets.keys()]);
    this.signingKeyId = this.keyIds[0];
  }

  has(keyId: string): boolean {
    return this.#secrets.has(keyId);
  }

  /** HMAC-SHA256 of `input` (UTF-8) under the key `keyId`; `undefined` for an unknown key. */
  hmac(keyId: string, input: string): Buffer | undefined {
    const secret = this.#secrets.get(keyId);
    return secret && createHmac('sha256', secret).update(input, 'utf8').digest();
  }
}

function secretBytes(secret: unknown): Buffer | undefined {
  if (typeof secret === 'string') return Buffer.from(secret, 'utf8');
  if (Buffer.isBuffer(secret)) return Buffer.from(secret);
  return undefined;
}
