import { randomUUID } from 'node:crypto';
import { InvalidPayloadRefError } from '../../../core/errors/invalid-payload-ref.error';

export const S3_STORE_NAME = 's3';

/** Instants in a ref: 12 hex digits of epoch ms reach the year 10889. */
const INSTANT_DIGITS = 12;
const LATEST_INSTANT = 16 ** INSTANT_DIGITS - 1;

/**
 * `<createdAt>-<expiresAt>-<uuid>`, instants as 12 lowercase hex digits of epoch ms. Nothing else
 * passes: no `/`, no `.`, no other prefix, so a ref can only ever name a key inside the store's
 * own `payloads/` folder.
 */
const REF_PATTERN =
  /^([0-9a-f]{12})-([0-9a-f]{12})-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The instants a ref was generated with (clamped to what 12 hex digits hold). */
export interface RefInstants {
  readonly createdAt: number;
  readonly expiresAt: number;
}

/**
 * A new ref. The creation and expiry instants lead the ref so that a listing, which S3 returns in
 * key order, is oldest first and tells expired payloads without a request per object.
 */
export function generateRef(createdAt: number, expiresAt: number): string {
  return `${instantDigits(createdAt, 'now')}-${instantDigits(expiresAt, 'expiresAt')}-${randomUUID()}`;
}

/** The instants of a ref this store generates, or `undefined` for anything else. */
export function parseRef(ref: string): RefInstants | undefined {
  const match = REF_PATTERN.exec(ref);
  if (!match) return undefined;
  return { createdAt: parseInt(match[1], 16), expiresAt: parseInt(match[2], 16) };
}

/**
 * The keys of one store: `<prefix>payloads/<ref>` holds a payload's bytes and its metadata;
 * `<prefix>published/<ref>`, an empty object, says that its ticket was published.
 */
export class S3PayloadKeys {
  readonly payloads: string;
  readonly published: string;

  constructor(prefix: string) {
    this.payloads = `${prefix}payloads/`;
    this.published = `${prefix}published/`;
  }

  /** The payload key of a ref from outside; throws `InvalidPayloadRefError` unless well-formed. */
  payloadOf(ref: string): string {
    return this.payloads + checkedRef(ref);
  }

  markerOf(ref: string): string {
    return this.published + checkedRef(ref);
  }

  /** The ref and instants of a key listed under `payloads/`, or `undefined` if not one of ours. */
  parsePayloadKey(key: string): (RefInstants & { readonly ref: string }) | undefined {
    if (!key.startsWith(this.payloads)) return undefined;
    const ref = key.slice(this.payloads.length);
    const instants = parseRef(ref);
    return instants && { ref, ...instants };
  }
}

function checkedRef(ref: string): string {
  if (typeof ref === 'string' && REF_PATTERN.test(ref)) return ref;
  throw new InvalidPayloadRefError(
    S3_STORE_NAME,
    typeof ref === 'string' && ref.length > 200 ? `${ref.slice(0, 200)}…` : String(ref),
    'it is not a ref this store generates (<created>-<expires>-<uuid>, lowercase hex)',
  );
}

function instantDigits(instant: number, name: string): string {
  if (Number.isNaN(instant) || typeof instant !== 'number') {
    throw new RangeError(`${name} must be an instant in epoch ms, got ${String(instant)}`);
  }
  // Out-of-range instants only happen with "never" (Infinity) or "long ago"; clamping keeps their
  // meaning for the sweeper, and head() reads the exact values from the object's metadata.
  const clamped = Math.min(Math.max(Math.floor(instant), 0), LATEST_INSTANT);
  return clamped.toString(16).padStart(INSTANT_DIGITS, '0');
}
