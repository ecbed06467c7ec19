import type { RejectionCode } from '../../../core/errors/rejection-code';
import type { HeaderMap } from '../../../core/headers';
import type {
  AcceptContext,
  AcceptResult,
  CompleteSequence,
  ExpiredSequence,
  FinishedOutcome,
  FragmentRecord,
  SequenceRef,
} from '../../../ports/sequence-store.port';
import { missingPositions, userHeaderBytes } from '../../../core/completeness';
import type { Grant, Settlement } from './redis-budget';
import type { ScriptArgument } from './redis-scripts';
import { RedisSequenceStoreError } from './redis-store.error';

/** Raw settlement as the scripts send it: {epoch, ver, storedBytes, firstAt, dueAt, refund, keyTtl}. */
type RawSettlement = [] | [string, string, string, string, string, string, string];

/*
 * Arguments for the store's scripts and the meaning of their answers: the TypeScript side of the
 * KEYS/ARGV/Returns headers of lua/*.lua.
 */

/**
 * How accept gets the body: in its arguments, or in a key the client set just before
 * (`stagedBodyKey(keys, id)`; the script builds that name from its KEYS, which carry the
 * client's key prefix, so only the id is passed).
 */
export type BodyArgument =
  { readonly kind: 'inline' } | { readonly kind: 'staged'; readonly id: string };

/**
 * What a store that encrypts keeps instead of the fragment's own body and user headers: the
 * sealed body, and the base64 of the sealed headers' JSON. Lengths and checks stay the plaintext's.
 */
export interface SealedFragment {
  readonly body: Buffer;
  readonly userHeaders: string;
}

/**
 * ARGV of lua/accept-5.lua; without the body (`false`), the script only admits the fragment.
 * `true` sends it inline.
 */
export function acceptArguments(
  fragment: FragmentRecord,
  context: AcceptContext,
  grant: Grant,
  marginMs: number,
  withBody: BodyArgument | boolean,
  /** `context.now` as the store sends it (see RedisClock.stamp). */
  now: ScriptArgument = context.now,
  sealed?: SealedFragment,
): ScriptArgument[] {
  const body: BodyArgument | undefined =
    withBody === true ? { kind: 'inline' } : withBody === false ? undefined : withBody;
  const args: ScriptArgument[] = [
    now,
    context.consumerId,
    context.leaseMs,
    context.expiry.ms,
    context.expiry.strategy === 'sliding' ? '1' : '0',
    context.retentionMs,
    marginMs,
    context.limits.maxSequenceBytes,
    context.limits.maxFragments,
    fragment.position,
    fragment.size ?? '',
    fragment.last ? '1' : '0',
    fragment.crc32,
    fragment.sha256 ?? '',
    fragment.bytes ?? '',
    fragment.body.length,
    fragment.contentType ?? '',
    fragment.contentEncoding ?? '',
    sealed?.userHeaders ?? JSON.stringify(fragment.userHeaders),
    // Budgets count the headers' JSON whether or not they are kept sealed.
    userHeaderBytes(fragment.userHeaders),
    grant.epoch,
    grant.bytes,
    grant.id,
    // Relative, so that it moves onto Redis's clock with `now` (see _clock.lua).
    Math.max(0, context.now - (context.startedAt ?? context.now)),
  ];
  if (body?.kind === 'inline') args.push('inline', sealed?.body ?? fragment.body);
  if (body?.kind === 'staged') args.push('staged', body.id);
  return args;
}

/** What the accept script's answer means for the caller's next move. */
export type AcceptStep =
  | {
      readonly kind: 'result';
      readonly result: AcceptResult;
      /** For the global index, when the sequence changed (or a grant is refunded). */
      readonly settlement?: Settlement;
      /** A budget epoch fenced by the script, to forget in the global index (0: none). */
      readonly forgetEpoch: number;
    }
  | {
      readonly kind: 'need';
      readonly bytes: number;
      /** True when the grant would open the sequence (its first stored fragment). */
      readonly opening: boolean;
      /** The budget bytes the sequence holds once this fragment is stored. */
      readonly total: number;
    }
  | { readonly kind: 'go' }
  | { readonly kind: 'void'; readonly forgetEpoch: number };

/**
 * The user headers a sequence keeps, from what the store holds: their JSON, or (a store that
 * encrypts) whatever opens it; `failure` when they cannot be read back.
 */
export type UserHeadersDecoder = (
  stored: string,
  ref: SequenceRef,
) => {
  readonly headers: HeaderMap;
  readonly failure?: string;
};

const plainUserHeaders: UserHeadersDecoder = (stored) => ({
  headers: JSON.parse(stored) as HeaderMap,
});

/**
 * The one place where the accept script's codes become {@link AcceptResult}s (or errors): see
 * the Returns section of lua/accept-5.lua for the layout.
 */
export function interpretAccept(
  reply: unknown,
  ref: SequenceRef,
  decodeHeaders: UserHeadersDecoder = plainUserHeaders,
): AcceptStep {
  const [code, rawSettlement, rawForget, ...rest] = reply as [
    string,
    RawSettlement,
    number,
    ...unknown[],
  ];
  const settlement = toSettlement(rawSettlement);
  const forgetEpoch = Number(rawForget);
  const result = (value: AcceptResult): AcceptStep => ({
    kind: 'result',
    result: value,
    settlement,
    forgetEpoch,
  });
  switch (code) {
    case 'stored':
      return result({ status: 'stored', opened: rest[0] === 1 });
    case 'duplicate':
      return result({ status: 'duplicate' });
    case 'in-progress':
      return result({ status: 'in-progress' });
    case 'complete':
      return result({
        status: 'complete',
        opened: rest[0] === 1,
        // Absent from the reply of an older script: not stored, so the sequence is read back.
        stored: rest[10] === 1,
        sequence: completeOf(ref, rest, decodeHeaders),
      });
    case 'finished': {
      const outcome = rest[0] as FinishedOutcome;
      const reason = optional(rest[1]);
      return result(
        reason === undefined
          ? { status: 'finished', outcome }
          : { status: 'finished', outcome, reason },
      );
    }
    case 'rejected':
    case 'dropped': {
      const [rejection, detail] = rest as [RejectionCode, string];
      return result({
        status: 'rejected',
        code: rejection,
        detail,
        sequenceRejected: code === 'dropped',
      });
    }
    case 'need':
      return {
        kind: 'need',
        bytes: Number(rest[0]),
        opening: Number(rest[1]) === 1,
        total: Number(rest[2]),
      };
    case 'go':
      return { kind: 'go' };
    case 'void':
      return { kind: 'void', forgetEpoch };
    default:
      throw new RedisSequenceStoreError(
        'accept',
        ref.sequenceId,
        `the accept script answered an unknown code ${String(code)}; ` +
          'are the Lua files of another version of nest-sequence?',
      );
  }
}

function completeOf(
  ref: SequenceRef,
  fields: unknown[],
  decodeHeaders: UserHeadersDecoder,
): CompleteSequence {
  const [, fragments, bytes, sha256, declaredBytes, contentType, contentEncoding, headers] = fields;
  const [first, last] = fields.slice(8);
  const declared = optional(declaredBytes);
  const kept = decodeHeaders(String(headers), ref);
  const complete: CompleteSequence = {
    scope: ref.scope,
    sequenceId: ref.sequenceId,
    fragments: Number(fragments),
    bytes: Number(bytes),
    sha256: optional(sha256),
    declaredBytes: declared === undefined ? undefined : Number(declared),
    contentType: optional(contentType),
    contentEncoding: optional(contentEncoding),
    userHeaders: kept.headers,
    firstFragmentAt: Number(first),
    lastFragmentAt: Number(last),
    integrityFailure: kept.failure,
  };
  return withoutUndefined(complete);
}

/** A script's "absent" (Lua false: null over RESP2, false over RESP3) as undefined. */
function optional(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  return typeof value === 'number' ? String(value) : undefined;
}

function withoutUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, field]) => field !== undefined)) as T;
}

export function toSettlement(raw: RawSettlement | undefined): Settlement | undefined {
  if (!raw || raw.length === 0) return undefined;
  const [epoch, ver, storedBytes, firstAt, dueAt, refund, keyTtl] = raw.map(Number);
  return { epoch, ver, storedBytes, firstAt, dueAt, refund, keyTtl };
}

/** The expire script's answer for an expired sequence, as the sweeper reports it. */
export function expiredOf(ref: SequenceRef, now: number, fields: unknown[]): ExpiredSequence {
  const [size, storedBytes, firstAt, lastAt, positions, age] = fields as [
    unknown,
    string,
    string,
    string,
    string[],
    unknown,
  ];
  const receivedPositions = positions.map(Number).sort((a, b) => a - b);
  const knownSize = optional(size) === undefined ? undefined : Number(size);
  return {
    scope: ref.scope,
    sequenceId: ref.sequenceId,
    receivedPositions,
    missingPositions: missingPositions(receivedPositions, knownSize),
    ...(knownSize !== undefined && { size: knownSize }),
    bufferedBytes: Number(storedBytes),
    firstFragmentAt: Number(firstAt),
    lastFragmentAt: Number(lastAt),
    // Measured by the script, on the clock firstAt is on (Redis's, when the caller's is off):
    // `now - firstAt` would add the caller's clock error. A report of an earlier release has none.
    ageMs: optional(age) === undefined ? now - Number(firstAt) : Number(age),
  };
}
