import type {
  AcceptOutcome,
  DrainClaim,
  DrainSettlement,
  ExpiringGap,
  GapPolicy,
  GapResolution,
  HandOffItem,
  OpenGap,
  ResequencerKeyState,
} from '../../../ports/resequencer-store.port';
import { CorruptRecord, decodeItem, type EntrySealing } from './redis-resequencer.codec';
import { RedisResequencerStoreError } from './redis-resequencer-store.error';

/*
 * The meaning of the resequencer scripts' answers: the TypeScript side of the Returns sections
 * of lua/rsq-*.lua. Every answer goes through one function here; anything else raises a
 * RedisResequencerStoreError naming the operation and the key.
 */

/**
 * A key's entry in its scope's index, as a per-key script reports it after a change (see
 * lua/_resequencer.lua); -1 stands for "none".
 */
export interface IndexRecord {
  readonly ver: number;
  readonly buffered: number;
  readonly next: number;
  readonly lowest: number;
  readonly gapSince: number;
  readonly alerted: boolean;
  readonly handOffAt: number;
  /** Time of the key's last indexed change: retention counts from it. */
  readonly at: number;
  /** Bytes of the key's buffered events. */
  readonly bufferedBytes: number;
}

/** A scope's buffered events and their bytes, as its index holds them. */
export interface ScopeTotals {
  readonly events: number;
  readonly bytes: number;
}

/** What a reply is about, for the error a reply this version does not understand raises. */
export interface ReplySource {
  readonly operation: string;
  readonly scope: string;
  readonly key?: string;
  /** How the key's entries are kept, when the store encrypts. */
  readonly sealing?: EntrySealing;
}

/**
 * A port result and the index record that came with it (none: the key has no state), or, from a
 * single-node "-ix" script that applied the record inline, the scope's totals after it.
 */
export interface WithRecord<T> {
  readonly result: T;
  readonly record?: IndexRecord;
  readonly totals?: ScopeTotals;
  /**
   * The ver of a retired key, instead of a record: its index entries (up to that ver) are to be
   * dropped, repairing any that a step the retirement overtook put back (see rsq-retire-3.lua).
   */
  readonly retiredVer?: number;
}

/** An index script's {events, bytes}; undefined for anything else. */
export function scopeTotals(raw: unknown): ScopeTotals | undefined {
  if (!Array.isArray(raw) || raw.length !== 2) return undefined;
  const [events, bytes] = raw as unknown[];
  if (!isInteger(events) || !isInteger(bytes)) return undefined;
  return { events, bytes };
}

/** Reads one `{code, record, ...}` reply; every accessor throws on a field of the wrong shape. */
class ScriptReply {
  readonly code: string;
  private readonly fields: readonly unknown[];

  constructor(
    readonly raw: unknown,
    private readonly source: ReplySource,
  ) {
    if (!Array.isArray(raw) || typeof raw[0] !== 'string' || !Array.isArray(raw[1])) {
      throw this.error();
    }
    this.fields = raw;
    this.code = raw[0];
  }

  integer(index: number): number {
    const value = this.fields[index];
    if (typeof value !== 'number' || !Number.isSafeInteger(value)) throw this.error();
    return value;
  }

  flag(index: number): boolean {
    const value = this.integer(index);
    if (value !== 0 && value !== 1) throw this.error();
    return value === 1;
  }

  oneOf<T extends string>(index: number, allowed: readonly T[]): T {
    const value = this.fields[index];
    if (!allowed.includes(value as T)) throw this.error();
    return value as T;
  }

  /** The scope's totals when the script applied its record inline ({events, bytes}). */
  appliedTotals(): ScopeTotals | undefined {
    const raw = this.fields[1] as unknown[];
    if (raw.length !== 2) return undefined;
    return scopeTotals(raw) ?? this.fail();
  }

  /** A retired key's {ver}, in the record's place (see lua/_resequencer.lua's repairRecord). */
  retiredVer(): number | undefined {
    const raw = this.fields[1] as unknown[];
    if (raw.length !== 1) return undefined;
    if (!Number.isSafeInteger(raw[0])) throw this.error();
    return raw[0] as number;
  }

  record(): IndexRecord | undefined {
    const raw = this.fields[1] as unknown[];
    if (raw.length === 0 || raw.length === 2) return undefined;
    if (raw.length !== 9 || !raw.every((value) => Number.isSafeInteger(value))) {
      throw this.error();
    }
    const [ver, buffered, next, lowest, gapSince, alerted, handOffAt, at, bufferedBytes] =
      raw as number[];
    return {
      ver,
      buffered,
      next,
      lowest,
      gapSince,
      alerted: alerted === 1,
      handOffAt,
      at,
      bufferedBytes,
    };
  }

  /** The drain claim appended at `index` by an accept with a holder, if any. */
  drainFrom(index: number): DrainClaim | undefined {
    if (this.fields.length <= index) return undefined;
    const code = this.oneOf(index, ['busy', 'claimed'] as const);
    return code === 'busy' ? { kind: 'busy' } : { kind: 'claimed', items: this.items(index + 1) };
  }

  items(from: number): HandOffItem[] {
    return this.fields.slice(from).map((text) => {
      if (typeof text !== 'string') throw this.error();
      return decodeStored(text, this.source);
    });
  }

  with<T>(result: T): WithRecord<T> {
    const totals = this.appliedTotals();
    if (totals) return { result, totals };
    const retiredVer = this.retiredVer();
    if (retiredVer !== undefined) return { result, retiredVer };
    const record = this.record();
    return record ? { result, record } : { result };
  }

  error(): RedisResequencerStoreError {
    return unexpected(this.source, this.raw);
  }

  private fail(): never {
    throw this.error();
  }
}

export function interpretAccept(raw: unknown, source: ReplySource): WithRecord<AcceptOutcome> {
  const reply = new ScriptReply(raw, source);
  const next = reply.integer(2);
  switch (reply.code) {
    case 'late': {
      const pending = reply.flag(3);
      const drain = reply.drainFrom(4);
      return reply.with(
        drain ? { kind: 'late', next, pending, drain } : { kind: 'late', next, pending },
      );
    }
    case 'released': {
      const count = reply.integer(3);
      const drain = reply.drainFrom(4);
      return reply.with(
        drain ? { kind: 'released', next, count, drain } : { kind: 'released', next, count },
      );
    }
    case 'duplicate':
      return reply.with({ kind: 'duplicate', next });
    case 'full': {
      const limit = reply.oneOf(3, [
        'maxBufferedPerKey',
        'maxBufferedTotal',
        'maxBufferedBytesPerKey',
        'maxBufferedBytesTotal',
        'maxSeqAhead',
      ] as const);
      return reply.with({ kind: 'full', next, limit });
    }
    case 'buffered':
      return reply.with({ kind: 'buffered', next, buffered: reply.integer(3) });
    default:
      throw reply.error();
  }
}

export function interpretClaim(raw: unknown, source: ReplySource): WithRecord<DrainClaim> {
  const reply = new ScriptReply(raw, source);
  switch (reply.code) {
    case 'empty':
      return reply.with({ kind: 'empty' });
    case 'busy':
      return { result: { kind: 'busy' } };
    case 'claimed':
      // With the key's record when the claim renewed its TTLs (its activity entry moves too).
      return reply.with({ kind: 'claimed', items: reply.items(2) });
    default:
      throw reply.error();
  }
}

export function interpretSettle(raw: unknown, source: ReplySource): WithRecord<DrainSettlement> {
  const reply = new ScriptReply(raw, source);
  switch (reply.code) {
    case 'lost':
      return reply.with({ kind: 'lost' });
    case 'empty':
      return reply.with({ kind: 'empty' });
    case 'claimed':
      return reply.with({ kind: 'claimed', items: reply.items(2) });
    default:
      throw reply.error();
  }
}

export function interpretResolve(
  raw: unknown,
  source: ReplySource,
  policy: GapPolicy,
): WithRecord<GapResolution> {
  const reply = new ScriptReply(raw, source);
  switch (reply.code) {
    case 'none':
      return reply.with({ kind: 'none' });
    case 'resolved': {
      const appended = reply.integer(2);
      if (policy !== 'skip') return reply.with({ kind: 'resolved', policy, appended });
      const skipped = { from: reply.integer(3), to: reply.integer(4), gapSince: reply.integer(5) };
      return reply.with({ kind: 'resolved', policy, appended, skipped });
    }
    default:
      throw reply.error();
  }
}

/** rsq-inspect's {next | nil, gapSince | nil, hand-off length, sequences, held bytes}. */
export function interpretInspect(
  raw: unknown,
  source: ReplySource,
  start: number,
): ResequencerKeyState {
  if (!Array.isArray(raw) || raw.length !== 5 || !Array.isArray(raw[3])) {
    throw unexpected(source, raw);
  }
  const [rawNext, rawGapSince, handOff, buffered, heldBytes] = raw as [
    unknown,
    unknown,
    unknown,
    unknown[],
    unknown,
  ];
  const next = optionalNumber(rawNext);
  const gapSince = optionalNumber(rawGapSince);
  const optional = [next, gapSince].every((value) => value === undefined || isInteger(value));
  if (!optional || !isInteger(handOff) || !buffered.every(isInteger) || !isInteger(heldBytes)) {
    throw unexpected(source, raw);
  }
  return {
    next: next ?? start,
    buffered,
    handOff,
    ...(gapSince === undefined ? {} : { gapSince }),
    ...(heldBytes === 0 ? {} : { heldBytes }),
  };
}

/**
 * rsq-gaps' flat {key, gapSince, record | nil, alerted (0 | 1), ...}: a key whose record is
 * missing is skipped.
 */
export function interpretGaps(raw: unknown, source: ReplySource): OpenGap[] {
  if (!Array.isArray(raw) || raw.length % 4 !== 0) throw unexpected(source, raw);
  const gaps: OpenGap[] = [];
  for (let i = 0; i < raw.length; i += 4) {
    const gap = openGapOf(raw.slice(i, i + 4) as unknown[], source, raw);
    if (gap) gaps.push(gap);
  }
  return gaps;
}

/**
 * rsq-expiring's reply: per key, rsq-gaps' four fields and the key's last change. A key whose
 * record is gone is left out.
 */
export function interpretExpiringGaps(raw: unknown, source: ReplySource): ExpiringGap[] {
  if (!Array.isArray(raw) || raw.length % 5 !== 0) throw unexpected(source, raw);
  const gaps: ExpiringGap[] = [];
  for (let i = 0; i < raw.length; i += 5) {
    const gap = openGapOf(raw.slice(i, i + 4) as unknown[], source, raw);
    const changedAt = Number(raw[i + 4]);
    if (!Number.isSafeInteger(changedAt)) throw unexpected(source, raw);
    if (gap) gaps.push({ ...gap, changedAt });
  }
  return gaps;
}

/** One listed gap: key, gapSince, index record (null: gone), alerted (1 | 0). */
function openGapOf(
  [key, gapSince, record, alerted]: unknown[],
  source: ReplySource,
  raw: unknown,
): OpenGap | undefined {
  if (record === null) return undefined;
  const fields = typeof record === 'string' ? record.split(':').map(Number) : [];
  const since = Number(gapSince);
  if (
    typeof key !== 'string' ||
    !Number.isSafeInteger(since) ||
    (fields.length !== 4 && fields.length !== 5) ||
    !fields.every(Number.isSafeInteger) ||
    (alerted !== 0 && alerted !== 1)
  ) {
    throw unexpected(source, raw);
  }
  const [, buffered, expected, lowest] = fields;
  return { key, expected, buffered, lowest, gapSince: since, alerted: alerted === 1 };
}

/** A stored item, decoded; a corrupt one raises the store's error (and stays in Redis). */
function decodeStored(text: string, source: ReplySource): HandOffItem {
  try {
    return decodeItem(text, source.sealing);
  } catch (error) {
    if (!(error instanceof CorruptRecord)) throw error;
    throw new RedisResequencerStoreError(
      source.operation,
      source.scope,
      source.key,
      `the hand-off list holds ${error.message}; remove or repair that item`,
      { cause: error },
    );
  }
}

/** A Lua nil (null over RESP2, false over RESP3) as undefined; a string as its number. */
function optionalNumber(value: unknown): number | undefined {
  if (value === null || value === false) return undefined;
  return typeof value === 'string' ? Number(value) : (value as number);
}

function isInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value);
}

function unexpected(source: ReplySource, reply: unknown): RedisResequencerStoreError {
  const text = JSON.stringify(reply) ?? String(reply);
  return new RedisResequencerStoreError(
    source.operation,
    source.scope,
    source.key,
    `the script answered ${text.length > 200 ? `${text.slice(0, 200)}…` : text}; ` +
      "deploy the library's lua/ files with its code",
  );
}
