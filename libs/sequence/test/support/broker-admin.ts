/** What the tests ask of a broker as an operator, whichever broker carries the transport. */

/** A message read back from a channel with the broker's plain client. */
export interface QueuedMessage {
  readonly body: Buffer;
  readonly headers: Record<string, unknown>;
}

/**
 * A broker seen through a plain client connection of the test's own: `RabbitMqAdmin` (queues)
 * and `NatsAdmin` (streams and their durable consumers) are two. A channel's messages are
 * "ready" until its consumer delivers them; a dead-letter channel is a channel like any other.
 */
export interface BrokerAdmin {
  /** A channel name of the test's own, registered (with its dead-letter channel) for cleanup. */
  newChannel(): string;
  /** Messages of `channel` not delivered yet (not those delivered and unacknowledged). */
  readyCount(channel: string): Promise<number>;
  /** At least the number of subscribers of `channel` ready to take a message. */
  consumerCount(channel: string): Promise<number>;
  /** Takes every ready message off `channel` (acknowledged: they are gone afterwards). */
  drain(channel: string): Promise<QueuedMessage[]>;
  /** Registers the partitions of `channel` (a partitioned channel's) for deletion in `cleanup`. */
  partitioned(channel: string, count: number): void;
  /** Deletes what `newChannel` handed out (and forgets it); safe to call twice. */
  cleanup(): Promise<void>;
  close(): Promise<void>;
}

export interface BrokerAdminOptions {
  /** Runs after each test, before its channels are deleted: close what uses them. */
  readonly beforeCleanup?: () => Promise<void>;
}

/**
 * Registers, in the calling describe block, an admin `connect` makes for its tests, the deletion
 * after each test of the channels it handed out, and its close after them. Call it before the
 * block's own hooks: jest runs hooks of one block in the order they were registered.
 */
export function useBrokerAdmin<A extends BrokerAdmin>(
  connect: () => Promise<A>,
  options: BrokerAdminOptions = {},
): { readonly admin: A } {
  let admin: A | undefined;
  beforeAll(async () => {
    admin = await connect();
  });
  afterEach(async () => {
    try {
      await options.beforeCleanup?.();
    } finally {
      await admin?.cleanup();
    }
  });
  afterAll(async () => {
    await admin?.close();
  });
  return {
    get admin() {
      if (!admin) throw new Error('no broker admin outside the describe block');
      return admin;
    },
  };
}
