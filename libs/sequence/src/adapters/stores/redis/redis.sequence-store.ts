/*
 * The Redis sequence store, and the protocol that keeps it correct on Redis Cluster.
 *
 * Keys (prefix `nseq` by default; `<member>` is `<scope, percent-encoded>:<sequence id>`):
 *   <prefix>:{seq:<member>}:meta   hash    sizes, declarations, times, deadline, lease, epoch, claim, ver
 *   <prefix>:{seq:<member>}:crc    hash    position -> CRC-32
 *   <prefix>:{seq:<member>}:body   hash    position -> body, for bodies up to 64 KiB (inline)
 *   <prefix>:{seq:<member>}:body:<position>  string  a larger body
 *   <prefix>:{seq:<member>}:staged:<uuid>    string  a larger body on its way in (60 s TTL)
 *   <prefix>:{seq:<member>}:done   hash    finished marker {outcome, reason, until, fence}
 *   <prefix>:{seq:<member>}:fence  string  epoch fence while there is no marker (rare, short-lived)
 *   <prefix>:{idx}:open        hash    member -> budget record "epoch:claim:ver:storedBytes"
 *   <prefix>:{idx}:due         zset    member -> when the sweeper may take it
 *   <prefix>:{idx}:first       zset    member -> first fragment time (oldestOpenAt)
 *   <prefix>:{idx}:retention   zset    member -> until when a failed sequence's fragments are kept
 *   <prefix>:{idx}:retained    hash    member -> "until:bytes"
 *   <prefix>:{idx}:totals      hash    claimed, stored, retained (sums), epoch (counter)
 * Small bodies travel as a script argument into one hash per sequence. A larger body never goes
 * through Lua (as an argument it costs Redis ~5 ms of CPU per MiB): the client SETs it under a
 * staged key, and the accept script RENAMEs that key into place (or deletes it when the fragment
 * is not stored), which costs ~1.6 ms per 8 MiB body. Finish, expire and drop delete the per-body
 * keys from the positions listed in :crc.
 * Every key has a TTL (its due time + lease + margin; markers: retention + margin), extended as
 * the state moves on; the global keys always outlive the sequence keys they account for. TTLs are
 * a safety net in real time: the logic runs on the `now` passed in, moved onto Redis's clock when
 * the caller's clock is off (lua/_clock.lua).
 *
 * A script runs in one slot, so no script can both store a fragment (sequence slot) and count it
 * against the store-wide budget (slot {idx}). accept therefore runs in steps:
 *   1. accept script, without the body unless small: answers everything that needs no budget
 *      (finished, contradiction, duplicate, lease take-over, limit drop), or 'go' (the sequence
 *      holds enough budget: send the body), or 'need N' (a grant of N more bytes is needed; a
 *      sequence always needs a grant to open). A large body of a sequence this store saw stored
 *      to recently, whose fragment declares the sequence's size and bytes (so that the grant the
 *      sequence opened with covers it), goes with this first call, as in step 3: staged by a SET
 *      sent right before the script, in the same flight, not awaited first (a script that runs
 *      before the SET lands, possible only on a Cluster redirection, finds no staged key and
 *      answers 'go'; the late SET's key expires unused). When the answer is not 'stored' the
 *      script deletes the staged body, and a later round sends it again.
 *   2. reserve script ({idx}): checks maxOpenSequences / maxBufferedBytes and adds N to the
 *      sequence's budget record, creating it (new epoch, counted open, provisional due time) if
 *      absent; or answers back-pressure (after evicting failed sequences' kept fragments, when
 *      that is what lets the grant through).
 *   3. accept script again, with the body and the grant {epoch, N}: re-checks everything, stores,
 *      and reports a settlement {epoch, ver, storedBytes, firstAt, dueAt, refund}.
 *   4. settle script ({idx}): applies the settlement if its ver is newer than the record's, and
 *      gives back the unused part of the grant.
 * Budget is thus reserved before bytes are stored and released only after they are gone: it
 * may be briefly over-reserved, never under-counted. Records are removed only by forget (after
 * finish, expire, a limit drop, or a stale record found by the sweeper), and only if they still
 * have the epoch the per-sequence step saw. The per-sequence side fences an epoch before its
 * record is forgotten (marker or fence key: no sequence can open on a grant of a fenced epoch,
 * and an open sequence only absorbs grants of its own epoch), so a grant can never be absorbed
 * into a record that is being removed. A consumer that dies between steps leaves at worst an
 * over-count or a record with no sequence; the record has a due time, so the sweeper lists it,
 * `expire` finds no sequence, fences the epoch and forgets the record. Over-counts inside a live
 * record (a refund overtaken by a newer settlement, a grant abandoned on back-pressure) go when
 * the sequence ends. On a single node the same steps run; the answers are identical.
 *
 * Redis unavailable: every method rejects with the client's error (after the ioredis client's
 * own retries: `maxRetriesPerRequest`, `enableOfflineQueue`, `commandTimeout` are the caller's
 * settings). The aggregator then requeues the fragment, acknowledging nothing unstored; a step
 * that failed after its fragment was stored is repaired by the redelivery (a duplicate) and by
 * the next settlement or the sweeper (which re-reads the sequence's own keys).
 */
import { Logger } from '@nestjs/common';
import type { RedisOptions } from 'ioredis';
import { isCluster, connectOwned, quitRedisClient } from './redis-client';
import {
  DIRECT_READS_MIN_BYTES,
  DIRECT_READS_RENAMED,
  RedisDirectReads,
} from './redis-direct-reads';
import { setBodyUncopied } from './redis-body.writer';
import { coalesceCommandWrites, withCoalescedWrites } from './redis-command-writes';
import { socketTricksEnabled, unsafeSocketTricksProblem } from '../../socket-tricks.guard';
import type { Readable } from 'node:stream';
import type {
  AcceptContext,
  AcceptResult,
  ExpiredSequence,
  FinishContext,
  FinishedOutcome,
  FragmentRecord,
  OpenSequenceInfo,
  OpenSequenceQuery,
  SequenceRef,
  SequenceStatus,
  SequenceStore,
  SequenceStoreStats,
} from '../../../ports/sequence-store.port';
import { NO_GRANT, RedisBudget, type Grant, type Reservation } from './redis-budget';
import { clockProblem, RedisClock } from './redis-clock';
import { RedisBodyReader, bodyGoneError, type BodyPiece } from './redis-body.reader';
import { randomUUID } from 'node:crypto';
import {
  bodyKeyAt,
  RedisKeys,
  sequenceKeyList,
  stagedBodyKey,
  type SequenceKeys,
} from './redis-keys';
import {
  acceptArguments,
  expiredOf,
  interpretAccept,
  toSettlement,
  type BodyArgument,
  type SealedFragment,
  type UserHeadersDecoder,
} from './redis-script-codec';
import { loadScripts, type RedisClient, type Scripts } from './redis-scripts';
import { RedisOpenSequences } from './redis-open-sequences';
import { RedisSequenceStoreError } from './redis-store.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { checkInteger } from '../../../core/option-checks';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import { errorMessage } from '../../../core/errors/caught';
import { deathReason } from '../../../core/errors/rejection-code';
import { neverFits } from '../../../core/completeness';
import {
  BodyCipher,
  openUserHeaders,
  sequenceBodyIdentity,
  sequenceHeadersIdentity,
  type StoreEncryptionOptions,
} from '../../../core/body-cipher';

export interface RedisSequenceStoreOptions {
  /**
   * Prepended to every key; without `{` or `}`.
   * @default 'nseq'
   */
  readonly prefix?: string;
  /**
   * How much longer than the logic needs them every key lives, so that state left by a crashed
   * consumer or sweeper still expires. Keep it above `leaseMs`.
   * @default 300_000
   */
  readonly keyTtlMarginMs?: number;
  /**
   * Pieces `read` fetches ahead of the stream (at least 1): a read holds at most this many plus
   * two (the one in the stream's buffer, the one its consumer is handling). A piece is a small
   * body, or up to `readPieceBytes` of a large one.
   * @default 4
   */
  readonly readAhead?: number;
  /** @deprecated the name of `readAhead` before reads went by pieces; used when that is unset. */
  readonly readAheadFragments?: number;
  /**
   * The most a read fetches of a large body at once: a body larger than this is read in ranges
   * (GETRANGE), so the memory a read holds is bounded by `(readAhead + 2) × readPieceBytes`
   * whatever the fragment size. At least 64 KiB.
   * @default 1 MiB
   */
  readonly readPieceBytes?: number;
  /**
   * Three socket tricks, each for memory or CPU at high throughput:
   * - large bodies are read back on a connection of the store's own (a `duplicate()` of its
   *   client, opened at the first read whose large bodies total 1 MiB or more, closed when idle)
   *   whose socket the store takes over from ioredis and whose replies it parses itself, without
   *   copying: half the allocations of reading through ioredis, whose parser joins every reply
   *   into a new Buffer, and most of the garbage a consumer holds at its peak. Any failure there
   *   falls back to the client itself. Not on Redis Cluster;
   * - a large body is written to the client's socket as it is, instead of being copied into the
   *   encoded command first;
   * - the client's socket is corked from the store's first script call in a turn of the event
   *   loop to the end of that turn, so the scripts of a batch leave in one `writev`. Not on
   *   Redis Cluster.
   *
   * They rely on ioredis's internals (its client's socket, `stream`, and how it writes a
   * command), written for ioredis 5.x: on any other version the store logs a warning and leaves
   * them off. Off, the store uses ioredis's public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
  /**
   * How a sequence that was verified as it arrived is checked again while its handler reads it
   * back. `'crc32'`: every body is checked against the CRC-32 it was stored with (and the stream
   * is counted to the byte), which catches accidental corruption and truncation in Redis at less
   * than half the CPU of a second SHA-256 pass. `'sha256'`: the payload is hashed again as the
   * handler reads it, which also catches a deliberate change by anyone who can write to Redis (a
   * CRC-32 can be forged). Sequences that were not verified as they arrived are always hashed
   * before their handler is called.
   * @default 'crc32'
   */
  readonly readVerification?: 'crc32' | 'sha256';
  /**
   * This machine's clock, which the `now` of the store's callers is read from. Leases and
   * deadlines run on Redis's clock whenever this one is more than 1 s away from it (see "Clocks"
   * in docs/configuration.md); a test gives an instance a skewed clock here.
   * @default Date.now
   */
  readonly clock?: () => number;
  /**
   * Keeps every body and the user headers AES-256-GCM encrypted in Redis, each under a fresh
   * IV and bound to its sequence and position (what is and is not encrypted: docs/security.md).
   * Budgets and checks count the plaintext; each body takes 98 bytes more in Redis.
   * @default none
   */
  readonly encryption?: StoreEncryptionOptions;
}

const REDIS_SEQUENCE_STORE_KEYS = {
  prefix: true,
  keyTtlMarginMs: true,
  readAhead: true,
  readAheadFragments: true,
  readPieceBytes: true,
  unsafeSocketTricks: true,
  readVerification: true,
  clock: true,
  encryption: true,
} as const satisfies OptionKeysOf<RedisSequenceStoreOptions>;
const WHERE = 'RedisSequenceStore options';

const READ_VERIFICATIONS: ReadonlySet<string> = new Set(['crc32', 'sha256']);

/**
 * Bodies up to this size go with the first accept round, as an argument (resending one costs
 * little); larger ones are staged in a key of their own that the script renames into place.
 */
const INLINE_BODY_BYTES = 64 * 1024;
/** Lifetime of a staged body: it is renamed or deleted by the accept call that follows. */
const STAGED_BODY_TTL_MS = 60_000;
/**
 * Sequences remembered as open (stored to by this store, not yet finished): a large body of one
 * goes with the first accept call. Oldest forgotten first; one forgotten costs a round trip.
 */
const KNOWN_OPEN_MAX = 1024;
/** Rounds of accept before giving up on a sequence that other instances keep changing. */
const MAX_ACCEPT_ROUNDS = 8;

const MAX_EVICTION_ROUNDS = 8;
const RETENTION_PURGE_BATCH = 100;
/** Bodies whose length one pipeline asks for when a read plans its pieces. */
const PIECE_PLAN_BATCH = 512;

/**
 * {@link SequenceStore} on Redis (single node or Cluster), shared by any number of consumer
 * instances. See the top of this file for the key layout and the budget protocol.
 *
 * @example
 * const store = new RedisSequenceStore(new Redis(process.env.REDIS_URL), { prefix: 'imaging' });
 */
export class RedisSequenceStore implements SequenceStore {
  readonly name = 'redis';
  readonly verifiesReads: boolean;
  readonly encrypts: boolean;

  private readonly logger = new Logger('RedisSequenceStore');
  private readonly keys: RedisKeys;
  private readonly scripts: Scripts;
  private readonly budget: RedisBudget;
  private readonly clock: RedisClock;
  private readonly openSequences: RedisOpenSequences;
  private readonly marginMs: number;
  private readonly readAhead: number;
  private readonly readPieceBytes: number;
  /** `unsafeSocketTricks`, asked for and on the ioredis they were written for. */
  private readonly socketTricks: boolean;
  private readonly directReads?: RedisDirectReads;
  private readonly cipher?: BodyCipher;
  private readonly decodeHeaders?: UserHeadersDecoder;
  private ownsClient = false;
  /** See KNOWN_OPEN_MAX: members, in the order they were last stored to. */
  private readonly knownOpen = new Set<string>();
  /** Sequences an accept of this store is opening (reserving their first grant), by member. */
  private readonly openings = new Map<string, Promise<void>>();

  constructor(
    private readonly redis: RedisClient,
    options: RedisSequenceStoreOptions = {},
  ) {
    this.keys = new RedisKeys(options.prefix ?? 'nseq');
    this.marginMs = options.keyTtlMarginMs ?? 300_000;
    this.readAhead = options.readAhead ?? options.readAheadFragments ?? 4;
    this.readPieceBytes = options.readPieceBytes ?? 1024 * 1024;
    this.verifiesReads = (options.readVerification ?? 'crc32') === 'crc32';
    this.encrypts = options.encryption !== undefined;
    const problems: string[] = [];
    checkOptionKeys(problems, options, REDIS_SEQUENCE_STORE_KEYS, DIRECT_READS_RENAMED);
    // Redis refuses PX 0 and a fractional TTL, after a script's earlier writes (not undone).
    checkInteger(problems, 'keyTtlMarginMs', this.marginMs, 1);
    checkInteger(problems, 'readAhead', this.readAhead, 1);
    checkInteger(problems, 'readPieceBytes', this.readPieceBytes, INLINE_BODY_BYTES);
    const tricks = unsafeSocketTricksProblem(options.unsafeSocketTricks);
    if (tricks) problems.push(tricks);
    if (
      options.readVerification !== undefined &&
      !READ_VERIFICATIONS.has(options.readVerification)
    ) {
      problems.push(
        `readVerification must be 'crc32' or 'sha256', got ${String(options.readVerification)}`,
      );
    }
    const clock = clockProblem(options.clock);
    if (clock) problems.push(clock);
    if (problems.length > 0) throw new SequenceOptionsError(WHERE, problems);
    if (options.encryption !== undefined) {
      const cipher = new BodyCipher(options.encryption, 'RedisSequenceStore encryption');
      this.cipher = cipher;
      this.decodeHeaders = (stored, ref: SequenceRef) =>
        openUserHeaders(cipher, Buffer.from(stored, 'base64'), ref);
    }
    this.socketTricks = socketTricksEnabled(
      options.unsafeSocketTricks ?? false,
      'ioredis',
      'RedisSequenceStore',
    );
    const scripts = loadScripts(redis);
    this.scripts = this.socketTricks ? withCoalescedWrites(redis, scripts) : scripts;
    this.clock = new RedisClock(this.scripts, options.clock);
    this.budget = new RedisBudget(redis, this.scripts, this.keys, this.marginMs, this.clock);
    this.openSequences = new RedisOpenSequences(redis, this.scripts, this.keys, this.clock);
    if (this.socketTricks && !isCluster(redis)) {
      this.directReads = new RedisDirectReads(redis);
    }
  }

  /** A store with a client of its own, which `close()` quits. */
  static connect(
    url: string,
    options: RedisSequenceStoreOptions & { readonly redis?: RedisOptions } = {},
  ): RedisSequenceStore {
    return connectOwned(
      url,
      options,
      WHERE,
      REDIS_SEQUENCE_STORE_KEYS,
      (client, own) => {
        const store = new RedisSequenceStore(client, own);
        store.ownsClient = true;
        return store;
      },
      DIRECT_READS_RENAMED,
    );
  }

  async accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult> {
    const member = this.keys.member(fragment);
    const sequenceKeys = this.keys.sequenceOf(member);
    const keys = sequenceKeyList(sequenceKeys);
    let grant: Grant = NO_GRANT;
    const sealed = this.seal(fragment);
    const stored = sealed?.body ?? fragment.body;
    const inline = stored.length <= INLINE_BODY_BYTES;
    // Only when it declares its sequence's size and bytes: the grant that opened the sequence
    // then covers it, where one of a streamed sequence needs a grant of its own ('need'), and
    // its body would go twice.
    const covered = fragment.size !== undefined && fragment.bytes !== undefined;
    const bodyFirst = () => inline || (covered && this.knownOpen.has(member));
    let withBody = bodyFirst();
    /** Set while this call is the one opening the sequence here (see the 'need' case). */
    let endOpening: (() => void) | undefined;
    let waits = 0;
    try {
      for (let round = 1; round <= MAX_ACCEPT_ROUNDS; round++) {
        let body: BodyArgument | false = false;
        if (withBody) body = inline ? { kind: 'inline' } : { kind: 'staged', id: randomUUID() };
        // Built before the body's SET is sent: what can throw here (the clock) must not leave a
        // staged body behind, nor a SET whose failure nobody hears (an unhandled rejection).
        const args = acceptArguments(
          fragment,
          context,
          grant,
          this.marginMs,
          body,
          this.clock.stamp(context.now),
          sealed,
        );
        let staging: Promise<unknown> | undefined;
        if (body && body.kind === 'staged') {
          // The script renames the key into place or deletes it; the TTL covers a crash between.
          // Sent ahead of the script on the same connection, so Redis runs it first (see above).
          const stagedKey = stagedBodyKey(sequenceKeys, body.id);
          // With socket tricks, the SET's three writes and the script's go out as one.
          if (this.socketTricks) coalesceCommandWrites(this.redis);
          staging = this.socketTricks
            ? setBodyUncopied(this.redis, stagedKey, stored, STAGED_BODY_TTL_MS)
            : this.redis.set(stagedKey, stored, 'PX', STAGED_BODY_TTL_MS);
        }
        const accepting = this.scripts.accept(keys, args);
        // A failed SET fails the call with its own error (the script then found no staged body).
        const reply = staging ? (await Promise.all([staging, accepting]))[1] : await accepting;
        const step = interpretAccept(reply, fragment, this.decodeHeaders);
        switch (step.kind) {
          case 'result':
            this.noteOpen(member, step.result.status === 'stored');
            if (step.settlement) await this.budget.settle(member, step.settlement);
            if (step.forgetEpoch > 0) {
              await this.budget.forget(
                member,
                step.forgetEpoch,
                context.retentionMs + this.marginMs,
              );
            }
            return step.result;
          case 'go':
            withBody = true;
            break;
          case 'void':
            await this.budget.forget(member, step.forgetEpoch, this.marginMs);
            grant = NO_GRANT;
            withBody = inline;
            break;
          case 'need': {
            if (step.opening && grant.epoch === 0 && !endOpening) {
              const opening = this.openings.get(member);
              if (opening && waits < MAX_ACCEPT_ROUNDS) {
                // Another fragment of the sequence is opening it from here: wait for it rather
                // than reserve a second time (each reservation is of the whole declared size, and
                // a burst of them can add up to back-pressure), then ask again.
                waits++;
                round--;
                await opening;
                withBody = bodyFirst();
                break;
              }
              if (!opening) {
                this.openings.set(member, new Promise<void>((resolve) => (endOpening = resolve)));
              }
            }
            const tooLarge = neverFits(step.total, context.limits);
            if (tooLarge) {
              // It could never fit, even alone: refused, rather than back-pressured forever. An open
              // sequence grown that far (streamed, with no declared bytes) goes, as one past
              // maxSequenceBytes does (finish forgets its budget record); unless it finished
              // meanwhile: the next round says how.
              if (step.opening) {
                if (grant.epoch > 0) await this.budget.forget(member, grant.epoch, this.marginMs);
              } else if (!(await this.rejectOpen(fragment, context, tooLarge))) {
                withBody = inline;
                break;
              }
              return {
                status: 'rejected',
                code: 'sequence-too-large',
                detail: tooLarge,
                sequenceRejected: !step.opening,
              };
            }
            const reservation = await this.reserve(member, step.bytes, context);
            if (reservation.kind === 'backpressure') {
              return { status: 'backpressure', limit: reservation.limit };
            }
            const granted = reservation.grant;
            // A grant the script found short is topped up (under the newest id: the sum is used once).
            grant =
              granted.epoch === grant.epoch
                ? { ...granted, bytes: grant.bytes + granted.bytes }
                : granted;
            withBody = true;
            break;
          }
        }
      }
    } finally {
      if (endOpening) {
        this.openings.delete(member);
        endOpening();
      }
    }
    throw new RedisSequenceStoreError(
      'accept',
      fragment.sequenceId,
      `fragment ${fragment.position} found no stable state after ${MAX_ACCEPT_ROUNDS} rounds ` +
        'of concurrent changes; it will be redelivered',
    );
  }

  /** Remembers (or forgets) that the sequence is open, for the next fragment's first call. */
  private noteOpen(member: string, open: boolean): void {
    this.knownOpen.delete(member);
    if (!open) return;
    this.knownOpen.add(member);
    if (this.knownOpen.size > KNOWN_OPEN_MAX) {
      const oldest = this.knownOpen.values().next().value;
      if (oldest !== undefined) this.knownOpen.delete(oldest);
    }
  }

  /**
   * Drops an open sequence that can never fit the budget and marks it rejected, as the accept
   * script does one over maxSequenceBytes; false when it finished (or completed) meanwhile.
   */
  private rejectOpen(ref: SequenceRef, context: AcceptContext, detail: string): Promise<boolean> {
    return this.finish(ref, 'rejected', {
      now: context.now,
      retentionMs: context.retentionMs,
      reason: deathReason('sequence-too-large', detail),
      consumerId: context.consumerId,
    });
  }

  /** What Redis keeps of the fragment when the store encrypts: sealed body and headers. */
  private seal(fragment: FragmentRecord): SealedFragment | undefined {
    const cipher = this.cipher;
    if (!cipher) return undefined;
    const headers = Buffer.from(JSON.stringify(fragment.userHeaders));
    return {
      body: cipher.seal(fragment.body, sequenceBodyIdentity(fragment, fragment.position)),
      userHeaders: cipher.seal(headers, sequenceHeadersIdentity(fragment)).toString('base64'),
    };
  }

  async renewLease(
    ref: SequenceRef,
    consumerId: string,
    leaseMs: number,
    now: number,
  ): Promise<boolean> {
    const reply = (await this.scripts['renew-lease'](this.leaseKeys(ref), [
      this.clock.stamp(now),
      consumerId,
      leaseMs,
      this.marginMs,
    ])) as [number, string[]?];
    const settlement = toSettlement(reply[1] as Parameters<typeof toSettlement>[0]);
    if (reply[0] !== 1 || !settlement) return false;
    await this.budget.settle(this.keys.member(ref), settlement);
    return true;
  }

  async releaseLease(ref: SequenceRef, consumerId: string, now: number): Promise<void> {
    const reply = (await this.scripts['release-lease'](this.leaseKeys(ref), [
      this.clock.stamp(now),
      consumerId,
      this.marginMs,
    ])) as [number, string[]?];
    const settlement = toSettlement(reply[1] as Parameters<typeof toSettlement>[0]);
    if (reply[0] === 1 && settlement) await this.budget.settle(this.keys.member(ref), settlement);
  }

  read(ref: SequenceRef): Readable {
    const keys = this.keys.sequence(ref);
    const cipher = this.cipher;
    /** Whether this read's large bodies are worth the connection of direct reads. */
    let direct = false;
    return new RedisBodyReader(
      async () => {
        const pieces = await this.piecesOf(keys, await this.readablePositions(ref, keys));
        const large = pieces.reduce((sum, piece) => sum + (piece.bytes ?? 0), 0);
        direct = large >= DIRECT_READS_MIN_BYTES;
        return pieces;
      },
      (piece) =>
        piece.bytes === undefined
          ? this.redis.hgetBuffer(keys.body, String(piece.position))
          : this.readRange(bodyKeyAt(keys, piece.position), piece.start, piece.bytes, direct),
      this.readAhead,
      ref.sequenceId,
      cipher && ((position) => cipher.opener(sequenceBodyIdentity(ref, position))),
    );
  }

  /**
   * `bytes` of the body at `key` from `start`: without copying when it can, else (and whenever
   * the direct read fails or comes back short) through the client, whose answer stands.
   */
  private async readRange(
    key: string,
    start: number,
    bytes: number,
    direct: boolean,
  ): Promise<readonly Buffer[] | Buffer> {
    const end = start + bytes - 1;
    const parts = direct
      ? await this.directReads?.getRangeOrNothing(key, start, end, (got) => got === bytes)
      : undefined;
    return parts ?? this.redis.getrangeBuffer(key, start, end);
  }

  /**
   * The pieces `read` fetches: a small body whole, from the body hash; a large one in ranges of
   * at most `readPieceBytes`, so that a read never holds a whole large body, whatever the
   * fragment size. One pipelined STRLEN per body tells which is which (0: not a key of its own);
   * the CRC-32 each body was stored with comes in the same round trip, for the reader to check.
   */
  private async piecesOf(keys: SequenceKeys, positions: readonly number[]): Promise<BodyPiece[]> {
    const pieces: BodyPiece[] = [];
    for (let from = 0; from < positions.length; from += PIECE_PLAN_BATCH) {
      const batch = positions.slice(from, from + PIECE_PLAN_BATCH);
      const pipeline = this.redis.pipeline();
      pipeline.hmget(keys.crc, ...batch.map(String));
      for (const position of batch) pipeline.strlen(bodyKeyAt(keys, position));
      const [crcs, ...lengths] = ((await pipeline.exec()) ?? []).map(([error, reply]) => {
        if (error) throw error;
        return reply;
      }) as [Array<string | null>, ...number[]];
      batch.forEach((position, index) => {
        const stored = crcs[index];
        if (stored === null || stored === undefined) throw bodyGoneError(position);
        const crc32 = Number(stored);
        const bytes = Number(lengths[index]);
        if (bytes === 0) {
          pieces.push({ position, start: 0, crc32 });
          return;
        }
        for (let start = 0; start < bytes; start += this.readPieceBytes) {
          const end = Math.min(start + this.readPieceBytes, bytes);
          pieces.push({
            position,
            start,
            bytes: end - start,
            crc32: end === bytes ? crc32 : undefined,
          });
        }
      });
    }
    return pieces;
  }

  async finish(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    context: FinishContext,
  ): Promise<boolean> {
    const member = this.keys.member(ref);
    const reply = (await this.scripts.finish(sequenceKeyList(this.keys.sequenceOf(member)), [
      outcome,
      this.clock.stamp(context.now),
      context.retentionMs,
      context.reason ?? '',
      this.marginMs,
      context.consumerId,
    ])) as Array<number | string>;
    const [finished, forgetEpoch, retainedBytes, retainUntil, releasedUntil, markerTtl] =
      reply.map(Number);
    if (finished !== 1) return false;
    // The outcome is committed: the caller must act on it (dead-letter a failed sequence) even
    // when the index step fails. The sweeper repairs the index (expire's 'stale').
    await this.afterCommit('finish', ref, async () => {
      if (forgetEpoch > 0 || retainUntil > 0) {
        const retained = retainUntil > 0 ? { until: retainUntil, bytes: retainedBytes } : undefined;
        await this.budget.forget(member, forgetEpoch, markerTtl, retained);
      }
      if (releasedUntil > 0) await this.budget.releaseRetained(member, releasedUntil);
    });
    return true;
  }

  /**
   * Runs the global index step that follows a committed per-sequence script. Its failure is
   * logged, not thrown: what the script committed stands, and the sweeper finds the index
   * record again and forgets it.
   */
  private async afterCommit(step: string, ref: SequenceRef, run: () => Promise<void>) {
    try {
      await run();
    } catch (error) {
      this.logger.warn(
        `${step} of sequence ${ref.sequenceId} is committed, but updating the index failed ` +
          `(${errorMessage(error)}): its budget stays claimed until the expiry sweeper finds it ` +
          `(at the sequence's deadline) and corrects the index`,
      );
    }
  }

  async listExpired(now: number, limit: number): Promise<SequenceRef[]> {
    for (const { member, until } of await this.budget.retentionsOver(now, RETENTION_PURGE_BATCH)) {
      await this.dropRetained(member, until);
    }
    const due = await this.budget.due(now, limit);
    return due.map((member) => this.keys.ref(member));
  }

  async expire(
    ref: SequenceRef,
    now: number,
    retentionMs: number,
  ): Promise<ExpiredSequence | null> {
    const member = this.keys.member(ref);
    const epoch = await this.budget.epochOf(member);
    if (epoch === undefined) return null;
    const [code, ...rest] = (await this.scripts.expire(
      sequenceKeyList(this.keys.sequenceOf(member)),
      // A token of this call: a reply lost and the command sent again finds its own expiry.
      [this.clock.stamp(now), retentionMs, epoch, this.marginMs, randomUUID()],
    )) as [string, ...unknown[]];
    switch (code) {
      case 'expired':
        await this.afterCommit('expiry', ref, () =>
          this.budget.forget(member, epoch, Number(rest[0])),
        );
        return expiredOf(ref, now, rest.slice(1));
      case 'not-due': {
        const settlement = toSettlement(rest[0] as Parameters<typeof toSettlement>[0]);
        if (settlement) await this.budget.settle(member, settlement);
        return null;
      }
      case 'stale': {
        // A failed sequence whose finish could not update the index: its kept fragments are
        // counted from now on, until they are dropped.
        const [retainUntil, retainedBytes] = rest.map(Number);
        const retained = retainUntil > 0 ? { until: retainUntil, bytes: retainedBytes } : undefined;
        await this.budget.forget(member, epoch, this.marginMs, retained);
        return null;
      }
      case 'other':
        return null;
      default:
        throw new RedisSequenceStoreError(
          'expire',
          ref.sequenceId,
          `the expire script answered an unknown code ${code}`,
        );
    }
  }

  async stats(now: number): Promise<SequenceStoreStats> {
    return this.budget.stats(now);
  }

  listOpen(query: OpenSequenceQuery): Promise<OpenSequenceInfo[]> {
    return this.openSequences.list(query);
  }

  async status(ref: SequenceRef, now: number): Promise<SequenceStatus> {
    const keys = this.keys.sequence(ref);
    // The state first, then the marker: a finish between the two reads (which drops the state and
    // writes the marker at once) is then seen as finished, never as unknown.
    const state = await this.redis.hget(keys.meta, 'state');
    const marker = await this.redis.hmget(keys.done, 'outcome', 'until', 'reason');
    const [outcome, until, reason] = marker;
    // The marker's `until` is on the scripts' clock (lua/_clock.lua): compare on that clock.
    if (outcome && Number(until) > (await this.clock.onRedisClock(now))) {
      return {
        state: 'finished',
        outcome: outcome as FinishedOutcome,
        ...(reason ? { reason } : {}),
      };
    }
    return state === 'open' ? { state: 'open' } : { state: 'unknown' };
  }

  inspect(ref: SequenceRef, now: number): Promise<OpenSequenceInfo | undefined> {
    return this.openSequences.inspect(ref, now);
  }

  /**
   * A read of a key in the `{idx}` slot, rather than PING: on Redis Cluster a PING goes to any
   * node, and every accept also runs a script on the node that owns `{idx}` (the budget).
   */
  async ping(): Promise<void> {
    await this.redis.exists(this.keys.global.totals);
  }

  /**
   * Closes the store's own connection for reads, and quits the client when `connect` created it;
   * a client passed in stays the caller's.
   */
  async close(): Promise<void> {
    await this.directReads?.close();
    if (!this.ownsClient) return;
    await quitRedisClient(this.redis);
  }

  /** Reserves budget, first evicting failed sequences' kept fragments when they are in the way. */
  private async reserve(
    member: string,
    increase: number,
    context: AcceptContext,
  ): Promise<Exclude<Reservation, { kind: 'evict' }>> {
    for (let round = 0; round < MAX_EVICTION_ROUNDS; round++) {
      const reservation = await this.budget.reserve(member, increase, {
        now: context.now,
        provisionalDue: context.now + context.expiry.ms,
        limits: context.limits,
        ttl: context.expiry.ms + context.leaseMs + this.marginMs,
      });
      if (reservation.kind !== 'evict') return reservation;
      for (const victim of reservation.victims)
        await this.dropRetained(victim.member, victim.until);
    }
    return { kind: 'backpressure', limit: 'maxBufferedBytes' };
  }

  private async dropRetained(member: string, until: number): Promise<void> {
    const keys = this.keys.sequenceOf(member);
    await this.scripts['drop-retained']([keys.meta, keys.crc, keys.body], [until]);
    await this.budget.releaseRetained(member, until);
  }

  /** Positions `read` streams: all of a complete sequence, or what a failed one kept. */
  private async readablePositions(ref: SequenceRef, keys: SequenceKeys): Promise<number[]> {
    const [[state, size], count] = await Promise.all([
      this.redis.hmget(keys.meta, 'state', 'size'),
      this.redis.hlen(keys.crc),
    ]);
    if (state === 'open' && size !== null && count === Number(size)) {
      return Array.from({ length: count }, (_, index) => index + 1);
    }
    if (state === 'failed') {
      return (await this.redis.hkeys(keys.crc)).map(Number).sort((a, b) => a - b);
    }
    throw new Error(
      `sequence ${ref.sequenceId} (scope ${ref.scope}) is not complete or no longer held; ` +
        'read it between a complete accept and finish',
    );
  }

  private leaseKeys(ref: SequenceRef): string[] {
    const keys = this.keys.sequence(ref);
    return [keys.meta, keys.crc, keys.body];
  }
}
