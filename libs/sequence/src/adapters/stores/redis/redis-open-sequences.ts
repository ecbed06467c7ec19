import { missingPositions } from '../../../core/completeness';
import type {
  OpenSequenceInfo,
  OpenSequenceQuery,
  SequenceRef,
} from '../../../ports/sequence-store.port';
import type { RedisClock } from './redis-clock';
import type { RedisKeys } from './redis-keys';
import type { RedisClient, Scripts } from './redis-scripts';

/** Members read from the deadline index per round trip while filtering by scope. */
const PAGE = 500;

type InspectReply =
  | null
  | [
      size: string | false | null,
      declaredBytes: string | false | null,
      storedBytes: string,
      firstAt: string,
      lastAt: string,
      deadline: string,
      complete: number,
      leaseOwner: string | false | null,
      positions: string[],
    ];

/**
 * The operator console's reads of the Redis sequence store: open sequences listed from the index
 * of open sequences by due time (`{idx}:due`), each inspected by a read-only script in its own
 * slot (lua/inspect-2.lua).
 */
export class RedisOpenSequences {
  constructor(
    private readonly redis: RedisClient,
    private readonly scripts: Scripts,
    private readonly keys: RedisKeys,
    private readonly clock: RedisClock,
  ) {}

  async list(query: OpenSequenceQuery): Promise<OpenSequenceInfo[]> {
    const limit = Math.max(0, Math.floor(query.limit));
    if (limit === 0) return [];
    const members = await this.members(query.scope, limit);
    const found = await Promise.all(
      members.map((member) => this.inspect(this.keys.ref(member), query.now)),
    );
    return found.filter((info): info is OpenSequenceInfo => info !== undefined);
  }

  async inspect(ref: SequenceRef, now: number): Promise<OpenSequenceInfo | undefined> {
    const keys = this.keys.sequence(ref);
    const reply = (await this.scripts.inspect(
      [keys.meta, keys.crc],
      [this.clock.stamp(now)],
    )) as InspectReply;
    if (!reply) return undefined;
    const [size, declared, stored, firstAt, lastAt, deadline, complete, lease, positions] = reply;
    const receivedPositions = positions.map(Number).sort((a, b) => a - b);
    const knownSize = size ? Number(size) : undefined;
    return {
      scope: ref.scope,
      sequenceId: ref.sequenceId,
      receivedPositions,
      missingPositions: missingPositions(receivedPositions, knownSize),
      size: knownSize,
      bytes: Number(stored),
      declaredBytes: declared ? Number(declared) : undefined,
      firstFragmentAt: Number(firstAt),
      lastFragmentAt: Number(lastAt),
      deadline: Number(deadline),
      complete: complete === 1,
      leaseHolder: lease || undefined,
    };
  }

  /** Members of the due index, earliest first: of one scope (its members' prefix) if given. */
  private async members(scope: string | undefined, limit: number): Promise<string[]> {
    const due = this.keys.global.due;
    if (scope === undefined) return this.redis.zrange(due, 0, limit - 1);
    const prefix = `${this.keys.member({ scope, sequenceId: '' })}`;
    const chosen: string[] = [];
    for (let start = 0; chosen.length < limit; start += PAGE) {
      const page = await this.redis.zrange(due, start, start + PAGE - 1);
      for (const member of page) {
        if (member.startsWith(prefix) && chosen.length < limit) chosen.push(member);
      }
      if (page.length < PAGE) break;
    }
    return chosen;
  }
}
