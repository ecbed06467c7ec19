import { Inject, Injectable } from '@nestjs/common';
import { BOUNDED_SEQUENCE_STORE } from '../kernel/tokens';
import type { OpenSequenceInfo, SequenceStore } from '../ports/sequence-store.port';
import { notFound, unsupported } from './admin.errors';

/** An open sequence as the store tells it, every position listed. */
export interface SequenceItem {
  readonly channel: string;
  readonly sequenceId: string;
  readonly receivedPositions: readonly number[];
  readonly missingPositions: readonly number[];
  readonly declaredFragments: number | null;
  readonly bytes: number;
  readonly declaredBytes: number | null;
  readonly openedAt: number;
  readonly lastFragmentAt: number;
  readonly ageMs: number;
  readonly deadlineAt: number;
  /** Every fragment is stored; a consumer (the lease holder) is reassembling it. */
  readonly complete: boolean;
  readonly leaseHolder: string | null;
}

export function sequenceItem(info: OpenSequenceInfo, now: number): SequenceItem {
  return {
    channel: info.scope,
    sequenceId: info.sequenceId,
    receivedPositions: info.receivedPositions,
    missingPositions: info.missingPositions,
    declaredFragments: info.size ?? null,
    bytes: info.bytes,
    declaredBytes: info.declaredBytes ?? null,
    openedAt: info.firstFragmentAt,
    lastFragmentAt: info.lastFragmentAt,
    ageMs: Math.max(0, now - info.firstFragmentAt),
    deadlineAt: info.deadline,
    complete: info.complete,
    leaseHolder: info.leaseHolder === undefined ? null : instanceOf(info.leaseHolder),
  };
}

/** `[first, last]`: consecutive positions, both included. */
export type PositionRange = readonly [number, number];

/** Ranges listed at most per position list; the counts are always exact. */
export const MAX_RANGES = 200;

/**
 * An open sequence as the API shows it: positions as ranges, at most 200 per list
 * (`truncated` when either list was cut), so a sequence of 100,000 scattered fragments stays
 * small.
 */
export interface SequenceView extends Omit<SequenceItem, 'receivedPositions' | 'missingPositions'> {
  readonly received: readonly PositionRange[];
  readonly missing: readonly PositionRange[];
  readonly receivedCount: number;
  readonly missingCount: number;
  readonly truncated: boolean;
}

export function sequenceView(item: SequenceItem): SequenceView {
  const { receivedPositions, missingPositions, ...rest } = item;
  const received = toRanges(receivedPositions);
  const missing = toRanges(missingPositions);
  return {
    ...rest,
    received: received.slice(0, MAX_RANGES),
    missing: missing.slice(0, MAX_RANGES),
    receivedCount: new Set(receivedPositions).size,
    missingCount: new Set(missingPositions).size,
    truncated: received.length > MAX_RANGES || missing.length > MAX_RANGES,
  };
}

/** Positions, in any order, as ascending ranges of consecutive ones: [1, 2, 4] → [[1, 2], [4, 4]]. */
export function toRanges(positions: readonly number[]): PositionRange[] {
  const sorted = [...positions].sort((a, b) => a - b);
  const ranges: [number, number][] = [];
  for (const position of sorted) {
    const last = ranges[ranges.length - 1];
    if (last && position <= last[1] + 1) last[1] = Math.max(last[1], position);
    else ranges.push([position, position]);
  }
  return ranges;
}

/** A completion lease's holder is `<consumerId>:<uuid of the attempt>`: the instance is the first part. */
const ATTEMPT = /:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function instanceOf(holder: string): string {
  return holder.replace(ATTEMPT, '');
}

/** Open sequences, from the sequence store. */
@Injectable()
export class SequencesReader {
  constructor(@Inject(BOUNDED_SEQUENCE_STORE) private readonly store: SequenceStore) {}

  get canList(): boolean {
    return typeof this.store.listOpen === 'function';
  }

  get canInspect(): boolean {
    return typeof this.store.inspect === 'function';
  }

  async list(channel: string | undefined, limit: number): Promise<SequenceView[]> {
    if (!this.store.listOpen) {
      throw unsupported(`the ${this.store.name} sequence store cannot list open sequences`);
    }
    const now = Date.now();
    const open = await this.store.listOpen({ scope: channel, limit, now });
    return open.map((info) => sequenceView(sequenceItem(info, now)));
  }

  /** The sequence, or undefined when it is not open. */
  async find(channel: string, sequenceId: string): Promise<SequenceItem | undefined> {
    if (!this.store.inspect) {
      throw unsupported(`the ${this.store.name} sequence store cannot inspect open sequences`);
    }
    const now = Date.now();
    const info = await this.store.inspect({ scope: channel, sequenceId }, now);
    return info && sequenceItem(info, now);
  }

  async one(channel: string, sequenceId: string): Promise<SequenceView> {
    const item = await this.find(channel, sequenceId);
    if (!item) {
      throw notFound(
        `sequence ${sequenceId} is not open on channel ${channel} ` +
          '(it completed, expired, failed, or never started)',
      );
    }
    return sequenceView(item);
  }
}
