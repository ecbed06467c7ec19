import { Inject, Injectable } from '@nestjs/common';
import { splitDeathReason } from '../core/errors/rejection-code';
import { ChannelRegistry } from '../kernel/channel.registry';
import { SEQUENCE_TRANSPORT } from '../kernel/tokens';
import {
  MAX_DEAD_LETTER_BROWSE,
  type DeadLetter,
  type DeadLetterActionResult,
  type DeadLetterBox,
  type DeadLetterLocation,
} from '../ports/dead-letter-box.port';
import type { Transport } from '../ports/transport.port';
import { reasonMatches } from '../ports/dead-letter-actions';
import type { MutationAnswer } from './admin-actions';
import type { DeadLetterSelection } from './admin-input';
import { conflict, unsupported } from './admin.errors';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';

export interface DeadLetterChannelSummary {
  /** The channel; for a dead-letter channel that several channels share, its own name. */
  readonly channel: string;
  readonly deadLetterChannel: string;
  /**
   * The channels (two or more) whose dead letters all go to this one dead-letter channel:
   * nothing in a dead letter says which of them it came from, so they are listed once, here.
   */
  readonly sharedBy?: readonly string[];
  readonly total: number;
  /**
   * Counts per reason code, among the oldest {@link MAX_DEAD_LETTER_BROWSE} (1000); `""` counts
   * those without a reason. Left out of the list of all channels
   * unless a grouping of that channel read in the last 30 seconds is at hand, or the
   * transport browses without disturbing its dead letters.
   */
  readonly byReason?: readonly { readonly reason: string; readonly count: number }[];
}

/** How long a channel's grouping by reason is reused before its dead letters are read again. */
export const REASONS_CACHE_MS = 30_000;
/** Most channels whose grouping is kept. */
const REASONS_CACHED = 100;

interface CachedReasons {
  readonly at: number;
  readonly summary: DeadLetterChannelSummary;
}

export type DeadLetterAnswer = MutationAnswer & DeadLetterActionResult;

/** Where the routes' `:channel` finds its dead letters. */
interface DeadLetterSource {
  /** What it is listed and acted on as: the channel, or a shared dead-letter channel's name. */
  readonly name: string;
  readonly deadLetterChannel: string;
  readonly location: DeadLetterLocation;
  /** Set when two or more channels dead-letter into `deadLetterChannel`: origins are unknown. */
  readonly sharedBy?: readonly string[];
}

/** Dead letters, through the transport's {@link DeadLetterBox}. */
@Injectable()
export class DeadLettersReader {
  private readonly reasons = new Map<string, CachedReasons>();

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    private readonly channels: ChannelRegistry,
  ) {}

  /** Most dead letters one request reads from a channel. */
  get maxBatch(): number {
    return this.options.maxBatch;
  }

  /** The transport's box, or undefined when it has none. */
  get box(): DeadLetterBox | undefined {
    return this.transport.deadLetters?.();
  }

  /** The channels whose dead letters are browsed: those consumed here, and the configured ones. */
  channelNames(): string[] {
    const names = this.channels.all().map((binding) => binding.channel);
    return [...new Set([...names, ...this.options.deadLetterChannels])].sort();
  }

  /**
   * Every channel's count, from the broker's own count: nothing is read. Grouped by reason where
   * a fresh grouping is cached, or where browsing takes nothing from the channel.
   */
  async summary(): Promise<DeadLetterChannelSummary[]> {
    const box = this.required();
    const summaries: DeadLetterChannelSummary[] = [];
    for (const source of this.sources()) {
      if (box.browseIsNonDestructive) {
        summaries.push(await this.freshReasons(box, source));
        continue;
      }
      const cached = this.cachedReasons(source.name);
      const total = (await box.count(source.name, source.location)) ?? cached?.total ?? 0;
      summaries.push({
        ...described(source),
        total,
        ...(cached && total > 0 ? { byReason: cached.byReason } : {}),
      });
    }
    return summaries;
  }

  /**
   * One channel's dead letters grouped by reason code: read from the channel at most once per
   * {@link REASONS_CACHE_MS} (an action on the channel reads it again).
   */
  async channelReasons(channel: string): Promise<DeadLetterChannelSummary> {
    const box = this.required();
    const source = this.sourceOf(channel);
    if (box.browseIsNonDestructive) return this.freshReasons(box, source);
    return this.cachedReasons(source.name) ?? this.reasonsOf(box, source);
  }

  /**
   * Where browsing takes nothing: the grouping cached within {@link REASONS_CACHE_MS} while the
   * channel's count has not changed since, else read again. A console refreshing every few
   * seconds would otherwise read up to {@link MAX_DEAD_LETTER_BROWSE} dead letters, bodies and
   * all, per channel and per refresh.
   */
  private async freshReasons(
    box: DeadLetterBox,
    source: DeadLetterSource,
  ): Promise<DeadLetterChannelSummary> {
    const cached = this.cachedReasons(source.name);
    if (cached && (await box.count(source.name, source.location)) === cached.total) return cached;
    return this.reasonsOf(box, source);
  }

  private cachedReasons(channel: string): DeadLetterChannelSummary | undefined {
    const cached = this.reasons.get(channel);
    if (cached && Date.now() - cached.at < REASONS_CACHE_MS) return cached.summary;
    this.reasons.delete(channel);
    return undefined;
  }

  private async reasonsOf(
    box: DeadLetterBox,
    source: DeadLetterSource,
  ): Promise<DeadLetterChannelSummary> {
    const channel = source.name;
    const page = await box.browse(channel, {
      limit: MAX_DEAD_LETTER_BROWSE,
      ...source.location,
    });
    const counts = new Map<string, number>();
    for (const letter of page.items) {
      const { code } = splitDeathReason(letter.reason);
      counts.set(code, (counts.get(code) ?? 0) + 1);
    }
    const summary: DeadLetterChannelSummary = {
      ...described(source),
      deadLetterChannel: page.items[0]?.deadLetterChannel ?? source.deadLetterChannel,
      total: page.total ?? page.items.length,
      byReason: [...counts]
        .map(([reason, count]) => ({ reason, count }))
        .sort((a, b) => b.count - a.count || a.reason.localeCompare(b.reason)),
    };
    this.reasons.delete(channel);
    this.reasons.set(channel, { at: Date.now(), summary });
    // Oldest first in a Map: drop from the front past the bound.
    for (const oldest of this.reasons.keys()) {
      if (this.reasons.size <= REASONS_CACHED) break;
      this.reasons.delete(oldest);
    }
    return summary;
  }

  /**
   * What the console lists: each browsed channel, except that channels sharing one dead-letter
   * channel (the module's `sequence.deadLetterChannel`, or one `deadLetterChannel` named by two
   * handlers) become one source under that dead-letter channel's name, read once.
   */
  sources(): DeadLetterSource[] {
    const byDeadLetterChannel = new Map<string, string[]>();
    for (const channel of this.channelNames()) {
      const deadLetterChannel = this.deadLetterChannelOf(channel);
      const sharing = byDeadLetterChannel.get(deadLetterChannel);
      if (sharing) sharing.push(channel);
      else byDeadLetterChannel.set(deadLetterChannel, [channel]);
    }
    return [...byDeadLetterChannel]
      .map(([deadLetterChannel, channels]): DeadLetterSource => {
        const [only] = channels;
        if (channels.length === 1 && only !== undefined) {
          return { name: only, deadLetterChannel, location: this.locationOf(only) };
        }
        return {
          name: deadLetterChannel,
          deadLetterChannel,
          location: { deadLetterChannel },
          sharedBy: channels,
        };
      })
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  /**
   * The source a route's `:channel` names: a channel sharing its dead-letter channel, or that
   * dead-letter channel's name, is the shared source; any other name is a channel of its own.
   */
  sourceOf(channel: string): DeadLetterSource {
    const sources = this.sources();
    return (
      sources.find((source) => source.sharedBy?.includes(channel)) ??
      sources.find((source) => source.name === channel) ?? {
        name: channel,
        deadLetterChannel: this.deadLetterChannelOf(channel),
        location: this.locationOf(channel),
      }
    );
  }

  private deadLetterChannelOf(channel: string): string {
    return this.locationOf(channel).deadLetterChannel ?? this.transport.deadLetterChannel(channel);
  }

  /**
   * Where the dead letters of a channel consumed here are, when its consumers were given a
   * `deadLetterChannel` of their own; the transport's naming otherwise.
   */
  private locationOf(channel: string): DeadLetterLocation {
    const deadLetterChannel = this.channels.get(channel)?.deadLetterChannel;
    return deadLetterChannel === undefined ? {} : { deadLetterChannel };
  }

  /**
   * Oldest first; `reason` matches a reason code or a whole reason, `''` no reason. The dead
   * letters of a shared dead-letter channel carry its name as `channel`: their origin is unknown.
   */
  async list(channel: string, reason: string | undefined, limit: number): Promise<DeadLetter[]> {
    const source = this.sourceOf(channel);
    const page = await this.required().browse(source.name, {
      limit,
      reason,
      ...source.location,
    });
    return page.items.filter((letter) => reasonMatches(letter.reason, reason));
  }

  /**
   * @throws AdminRequestError `conflict` for a shared dead-letter channel: a replay would send
   * every channel's dead letters to one of them
   */
  async replay(channel: string, selection: DeadLetterSelection): Promise<DeadLetterAnswer> {
    const box = this.required();
    const source = this.sourceOf(channel);
    if (source.sharedBy) {
      throw conflict(
        `${originsUnknown(source.sharedBy, source.deadLetterChannel)}: the console cannot replay them. ` +
          'Republish each by hand to its own channel, or discard it; to replay from here, give ' +
          'each handler a deadLetterChannel of its own',
      );
    }
    const ids = await this.select(box, source, selection);
    if (ids.length === 0) return nothingSelected(channel, selection);
    this.reasons.delete(channel);
    const result = await box.replay(channel, ids, {
      ratePerSecond: this.options.replayRatePerSecond,
      ...source.location,
    });
    this.reasons.delete(channel);
    return answer('replayed', channel, result);
  }

  /**
   * Ids are unique within a dead-letter channel, so a discard by ids is safe on a shared one. By
   * `reason` or `all` it takes every sharing channel's: refused when asked through one of them.
   * @throws AdminRequestError `conflict` for `reason` or `all` through a channel that shares
   */
  async discard(channel: string, selection: DeadLetterSelection): Promise<DeadLetterAnswer> {
    const box = this.required();
    const source = this.sourceOf(channel);
    if (source.sharedBy && source.name !== channel && selection.kind !== 'ids') {
      throw conflict(
        `${originsUnknown(source.sharedBy, source.deadLetterChannel)}: discard by ids, or ` +
          `discard them all through ${source.deadLetterChannel}`,
      );
    }
    const ids = await this.select(box, source, selection);
    if (ids.length === 0) return nothingSelected(source.name, selection);
    const result = await box.discard(source.name, ids, source.location);
    this.reasons.delete(source.name);
    return answer('discarded', source.name, result);
  }

  private async select(
    box: DeadLetterBox,
    source: DeadLetterSource,
    selection: DeadLetterSelection,
  ): Promise<string[]> {
    if (selection.kind === 'ids') return [...selection.ids];
    const reason = selection.kind === 'reason' ? selection.reason : undefined;
    const page = await box.browse(source.name, {
      limit: this.options.maxBatch,
      reason,
      ...source.location,
    });
    return page.items
      .filter((letter) => reasonMatches(letter.reason, reason))
      .map((letter) => letter.id);
  }

  private required(): DeadLetterBox {
    const box = this.box;
    if (!box) {
      throw unsupported(`the ${this.transport.name} transport offers no dead-letter browsing`);
    }
    return box;
  }
}

/** Why the dead letters of a shared dead-letter channel cannot be told apart. */
function originsUnknown(sharedBy: readonly string[], deadLetterChannel: string): string {
  return (
    `the dead letters of ${sharedBy.join(', ')} all go to ${deadLetterChannel} ` +
    'and nothing in them says which channel each came from'
  );
}

function described(source: DeadLetterSource): Omit<DeadLetterChannelSummary, 'total'> {
  return {
    channel: source.name,
    deadLetterChannel: source.deadLetterChannel,
    ...(source.sharedBy ? { sharedBy: source.sharedBy } : {}),
  };
}

function nothingSelected(channel: string, selection: DeadLetterSelection): DeadLetterAnswer {
  const what =
    selection.kind !== 'reason'
      ? 'at all'
      : selection.reason === ''
        ? 'without a reason'
        : `with reason ${selection.reason}`;
  return {
    changed: 0,
    message: `nothing changed: channel ${channel} has no dead letters ${what}`,
    done: [],
    missing: [],
    failed: [],
  };
}

function answer(verb: string, channel: string, result: DeadLetterActionResult): DeadLetterAnswer {
  const parts = [`${result.done.length} ${verb}`];
  if (result.missing.length > 0) {
    parts.push(
      `${result.missing.length} no longer in the dead-letter channel ` +
        '(already replayed, discarded or expired): nothing changed for them',
    );
  }
  if (result.failed.length > 0) parts.push(`${result.failed.length} failed and stay dead-lettered`);
  const uncertain = result.uncertain ?? [];
  if (uncertain.length > 0) {
    parts.push(
      `${uncertain.length} ${verb}, but the dead letter may still be in the dead-letter channel: ` +
        'do not replay it again',
    );
  }
  const changed = result.done.length + uncertain.length;
  const prefix = changed === 0 ? 'nothing changed: ' : '';
  return {
    changed,
    message: `${prefix}${parts.join('; ')} (channel ${channel})`,
    done: result.done,
    missing: result.missing,
    failed: result.failed,
    ...(uncertain.length > 0 ? { uncertain } : {}),
  };
}
