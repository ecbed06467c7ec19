import { eventually } from '../../support/sequence-test-app';
import type { BrokerAdmin, QueuedMessage } from '../../support/broker-admin';

/**
 * Reads a queue with the broker's plain client (through a {@link BrokerAdmin}: amqplib, or a
 * NATS connection), keeping every message in the order the broker handed it out: the order in
 * which the resequencer published them. The output queue only exists once a resequencer first
 * published to it, so until then it reads as empty.
 */
export class QueueCollector {
  readonly messages: QueuedMessage[] = [];

  constructor(
    private readonly admin: BrokerAdmin,
    readonly queue: string,
  ) {}

  /** Takes every ready message off the queue; answers all collected so far. */
  async collect(): Promise<QueuedMessage[]> {
    try {
      this.messages.push(...(await this.admin.drain(this.queue)));
    } catch (error) {
      if (!isNotFound(error)) throw error;
    }
    return this.messages;
  }

  /** Collects until at least `count` messages arrived; fails naming `what` after `timeoutMs`. */
  async atLeast(count: number, what: string, timeoutMs = 10_000): Promise<QueuedMessage[]> {
    await eventually(
      async () => (await this.collect()).length >= count,
      `${what} (${count} on ${this.queue}; ${this.messages.length} so far)`,
      timeoutMs,
    );
    return this.messages;
  }

  /** Sequence numbers by key (`x-resequence-key` / `x-resequence-seq`), in arrival order. */
  seqsByKey(): Map<string, number[]> {
    const byKey = new Map<string, number[]>();
    for (const { headers } of this.messages) {
      const key = String(headers['x-resequence-key']);
      byKey.set(key, [...(byKey.get(key) ?? []), Number(headers['x-resequence-seq'])]);
    }
    return byKey;
  }
}

/** A 404 from the broker: amqplib rejects `get` with the close frame, `checkQueue` with an Error. */
function isNotFound(error: unknown): boolean {
  const failure = error as { code?: unknown; fields?: { replyCode?: unknown } } | null;
  return failure?.code === 404 || failure?.fields?.replyCode === 404;
}

/** The body `publishKeyedEvent` gives an event by default, `<key>#<seq>`, read from its headers. */
export function defaultBodyOf({ headers }: QueuedMessage): string {
  return `${String(headers['x-resequence-key'])}#${Number(headers['x-resequence-seq'])}`;
}
