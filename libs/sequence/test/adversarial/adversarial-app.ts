/**
 * The application the adversarial suite attacks: one consumer of every pattern, each on a channel
 * of its own, with small budgets, on the embedded defaults or on RabbitMQ and Redis.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Injectable, type INestApplicationContext } from '@nestjs/common';
import type { Redis } from 'ioredis';
import {
  ClaimCheck,
  ClaimCheckService,
  ClaimedPayload,
  FilesystemPayloadStore,
  InboxHandler,
  InMemoryTransport,
  MemoryResequencerStore,
  MemorySequenceStore,
  Resequenced,
  ResequencedEvent,
  SequencedHandler,
  SplitterService,
  StreamedFragment,
  type OutboxEvent,
  type ResequencerStore,
  type SequenceModuleOptions,
  type SequenceStore,
  type Transport,
} from 'nest-sequence';
import { redis as redisStores } from 'nest-sequence/redis';
import type { ClaimTicketKey, HeaderMap } from 'nest-sequence/wire';
import { ExpirySweeper } from '../../src/sequence/expiry.sweeper';
import { GapSweeper } from '../../src/resequencer/gap.sweeper';
import { OrphanSweeper } from '../../src/claim-check/orphan.sweeper';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import { RESEQUENCER_STORE, SEQUENCE_STORE } from '../../src/kernel/tokens';
import { recordingHandler, type RecordingHandler } from '../support/sequence-test-app';
import { namedTransport, RabbitMqAdmin } from '../support/rabbitmq.fixture';
import { deleteUnder, redisClient } from '../support/redis.fixture';
import { SERVERS } from '../support/servers';
import { closeAll, createTestApp, type Closer } from '../support/test-app';

const KiB = 1024;
const MiB = 1024 * KiB;

/**
 * The budgets every consumer of the app runs under: small, so that a hostile input reaches them
 * with little traffic. What the suite measures is held to these plus {@link SLACK}.
 */
export const BUDGETS = {
  /** `sequence.maxBufferedBytes`: every open sequence of the store. */
  maxBufferedBytes: 4 * MiB,
  /** `sequence.maxChannelBufferedBytes`: one channel's open sequences. */
  maxChannelBufferedBytes: 512 * KiB,
  maxSequenceBytes: 256 * KiB,
  maxFragmentBytes: 64 * KiB,
  maxFragments: 256,
  maxHeaderBytes: 2 * KiB,
  maxOpenSequences: 5_000,
  /** `resequencer.maxBufferedBytesPerKey` of the `@Resequenced` channel. */
  maxBufferedBytesPerKey: 64 * KiB,
  maxBufferedPerKey: 64,
  /** `resequencer.maxBufferedBytesTotal` (and the stream-mode resequencer's). */
  maxBufferedBytesTotal: 1 * MiB,
  /** `claimCheck.inlineMaxBytes`. */
  inlineMaxBytes: 4 * KiB,
} as const;

/**
 * What a measurement may exceed its budget by: the Nest application, V8's own growth between
 * two collections, a dead-letter queue of refused messages, Redis's per-key overheads and the
 * resequencer's base64. Fixed, and far below what one unbounded structure would reach in a case.
 */
export const SLACK = {
  /** Process heap plus ArrayBuffers, after a full collection. */
  memoryBytes: 32 * MiB,
  /** Summed MEMORY USAGE of the keys under the app's prefix. */
  redisBytes: 8 * MiB,
  /** Keys under the app's prefix. */
  redisKeys: 500,
} as const;

/** Keys of one sequence the Redis store keeps at most (meta, crc, body, done, fence). */
export const KEYS_PER_SEQUENCE = 5;

export type Target = 'embedded' | 'rabbitmq-redis';

/** The ticket keys of the app and of the tests that sign tickets for it. */
export const SIGNING_KEYS: ClaimTicketKey[] = [{ id: 'adversarial', secret: randomBytes(32) }];
/** Another key, unknown to the app: tickets signed with it are forged. */
export const FORGER_KEYS: ClaimTicketKey[] = [{ id: 'adversarial', secret: randomBytes(32) }];

/** The channels of one app: names unique to the run on a shared broker. */
export interface AdversarialChannels {
  readonly reassemble: string;
  readonly stream: string;
  readonly claim: string;
  readonly resequenced: string;
  readonly inbox: string;
}

export type ChannelKind = keyof AdversarialChannels;

/** The event type the `@InboxHandler` takes. */
export const INBOX_EVENT_TYPE = 'AdversarialEvent';

export class StreamRecorder {
  readonly fragments: StreamedFragment[] = [];
  handle(fragment: StreamedFragment): void {
    this.fragments.push(fragment);
  }
}

export class ClaimRecorder {
  readonly payloads: { via: string; bytes: Buffer; headers: HeaderMap; sequenceId?: string }[] = [];
  async handle(payload: ClaimedPayload): Promise<void> {
    const bytes = await payload.toBuffer();
    this.payloads.push({
      via: payload.via,
      bytes,
      headers: { ...payload.headers },
      sequenceId: payload.sequenceId,
    });
  }
}

export class ResequencedRecorder {
  readonly events: { key: string; seq: number; body: Buffer }[] = [];
  handle(event: ResequencedEvent): void {
    this.events.push({ key: event.key, seq: event.seq, body: event.body });
  }
}

export class InboxRecorder {
  readonly events: OutboxEvent[] = [];
  handle(event: OutboxEvent): void {
    this.events.push(event);
  }
}

function handlers(channels: AdversarialChannels) {
  @Injectable()
  class Stream extends StreamRecorder {
    @SequencedHandler({ channel: channels.stream, mode: 'stream' })
    override handle(fragment: StreamedFragment): void {
      super.handle(fragment);
    }
  }
  @Injectable()
  class Claim extends ClaimRecorder {
    @ClaimCheck({ channel: channels.claim })
    override handle(payload: ClaimedPayload): Promise<void> {
      return super.handle(payload);
    }
  }
  @Injectable()
  class Ordered extends ResequencedRecorder {
    @Resequenced({
      channel: channels.resequenced,
      gap: { timeoutMs: 60_000, policy: 'dead-letter' },
      maxBufferedPerKey: BUDGETS.maxBufferedPerKey,
      maxBufferedBytesPerKey: BUDGETS.maxBufferedBytesPerKey,
      overflow: 'dead-letter',
    })
    override handle(event: ResequencedEvent): void {
      super.handle(event);
    }
  }
  @Injectable()
  class Inbox extends InboxRecorder {
    @InboxHandler({ event: INBOX_EVENT_TYPE, channel: channels.inbox })
    override handle(event: OutboxEvent): void {
      super.handle(event);
    }
  }
  return {
    Reassemble: recordingHandler({ channel: channels.reassemble }),
    Stream,
    Claim,
    Ordered,
    Inbox,
  };
}

/** A message as the suite takes it off a dead-letter channel. */
export interface DeadLetter {
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, unknown>>;
}

export interface AdversarialApp {
  readonly target: Target;
  readonly app: INestApplicationContext;
  readonly channels: AdversarialChannels;
  /** What the suite publishes with: another connection to the same broker. */
  readonly producer: Transport;
  readonly splitter: SplitterService;
  readonly claimCheck: ClaimCheckService;
  readonly sequenceStore: SequenceStore;
  readonly resequencerStore: ResequencerStore;
  readonly metrics: ModuleMetrics;
  readonly reassembled: RecordingHandler;
  readonly streamed: StreamRecorder;
  readonly claimed: ClaimRecorder;
  readonly ordered: ResequencedRecorder;
  readonly inboxed: InboxRecorder;
  /** On RabbitMQ + Redis: the client and prefix the stores write under. */
  readonly redis?: { readonly client: Redis; readonly prefix: string };
  /** Removes and returns what waits on the dead-letter channel of `channel`. */
  takeDeadLetters(channel: string): Promise<DeadLetter[]>;
  /** Messages of `channel` waiting or in a consumer's hands (not those held for a delayed requeue). */
  pending(channel: string): Promise<number>;
  /** Runs every sweeper once, as at `now`. */
  sweep(now: number): Promise<void>;
  /** Each sweeper on its own. */
  readonly sweepers: {
    readonly expiry: ExpirySweeper;
    readonly gaps: GapSweeper;
    readonly orphans: OrphanSweeper;
  };
  close(): Promise<void>;
}

/**
 * The app on `target`: the embedded defaults (in-memory transport, memory stores, filesystem
 * payload store, SQLite inbox) or RabbitMQ with every Redis store under a prefix of the run's
 * own. Timers are off: the suite sweeps by calling {@link AdversarialApp.sweep}.
 */
export async function createAdversarialApp(
  target: Target,
  options: {
    /**
     * `sequence.retentionMs`: how long completion markers drop late duplicates. The catalogue
     * keeps it short, so that Redis holds no marker for long after a sweep.
     * @default 1
     */
    retentionMs?: number;
    /**
     * `tuning.backpressureDelayMs`: how long a fragment the app hands back (its sequence busy,
     * the budget full) waits before it comes again.
     * @default 20
     */
    backpressureDelayMs?: number;
  } = {},
): Promise<AdversarialApp> {
  const run = randomUUID();
  const resources: Closer[] = [];
  let channels: AdversarialChannels | undefined;
  let transport: Transport;
  let producer: Transport;
  let admin: RabbitMqAdmin | undefined;
  let redis: { client: Redis; prefix: string } | undefined;
  let stores: SequenceModuleOptions['stores'];
  let payloadStore: FilesystemPayloadStore | undefined;
  try {
    if (target === 'embedded') {
      // A directory of its own: the suite sweeps as of an hour from now, which must not touch
      // the payloads of other programs in the shared default directory.
      const root = await mkdtemp(join(tmpdir(), 'nseq-adversarial-'));
      resources.push(() => rm(root, { recursive: true, force: true }));
      payloadStore = new FilesystemPayloadStore({ root });
      const owned = payloadStore;
      resources.push(() => owned.close());
      const stem = `adv.${run}`;
      channels = {
        reassemble: `${stem}.reassemble`,
        stream: `${stem}.stream`,
        claim: `${stem}.claim`,
        resequenced: `${stem}.resequenced`,
        inbox: `${stem}.inbox`,
      };
      transport = new InMemoryTransport();
      producer = transport;
      resources.push(() => transport.close());
    } else {
      const broker = await RabbitMqAdmin.connect();
      admin = broker;
      // Queues of the run's own, deleted (with their dead-letter queues) when the app closes.
      resources.push(() => broker.close());
      channels = {
        reassemble: broker.newChannel(),
        stream: broker.newChannel(),
        claim: broker.newChannel(),
        resequenced: broker.newChannel(),
        inbox: broker.newChannel(),
      };
      transport = await namedTransport(`nseq-adv-${run}`);
      resources.push(() => transport.close());
      producer = await namedTransport(`nseq-adv-producer-${run}`);
      resources.push(() => producer.close());
      const prefix = `nseq-adv:${run}`;
      const client = redisClient();
      resources.push(async () => {
        await deleteUnder(client, prefix);
        await client.quit();
      });
      redis = { client, prefix };
      stores = redisStores(SERVERS.redis.url, {
        prefix,
        sequenceStore: { keyTtlMarginMs: 1_000 },
      });
    }
  } catch (error) {
    await closeAll(resources);
    throw error;
  }
  const { Reassemble, Stream, Claim, Ordered, Inbox } = handlers(channels);
  const { app, close } = await createTestApp({
    sequence: {
      transport,
      stores,
      sequence: {
        ...(target === 'embedded' ? { store: new MemorySequenceStore() } : {}),
        maxBufferedBytes: BUDGETS.maxBufferedBytes,
        maxChannelBufferedBytes: BUDGETS.maxChannelBufferedBytes,
        maxSequenceBytes: BUDGETS.maxSequenceBytes,
        maxFragmentBytes: BUDGETS.maxFragmentBytes,
        fragmentBytes: 16 * KiB,
        maxFragments: BUDGETS.maxFragments,
        maxHeaderBytes: BUDGETS.maxHeaderBytes,
        maxOpenSequences: BUDGETS.maxOpenSequences,
        timeoutMs: 60_000,
        retentionMs: options.retentionMs ?? 1,
      },
      resequencer: {
        ...(target === 'embedded' ? { store: new MemoryResequencerStore() } : {}),
        maxBufferedBytesTotal: BUDGETS.maxBufferedBytesTotal,
      },
      claimCheck: {
        ...(payloadStore ? { store: payloadStore } : {}),
        signingKeys: SIGNING_KEYS,
        inlineMaxBytes: BUDGETS.inlineMaxBytes,
      },
      outbox: {
        inboxEvents: { pollIntervalMs: 50, retry: { baseDelayMs: 10, maxDelayMs: 40 } },
      },
      tuning: {
        backpressureDelayMs: options.backpressureDelayMs ?? 20,
        sweepers: {
          expiry: { intervalMs: false },
          gaps: { intervalMs: false },
          orphans: { intervalMs: false },
        },
      },
    },
    providers: [Reassemble, Stream, Claim, Ordered, Inbox],
    logger: process.env.TEST_LOGS ? ['log', 'warn', 'error'] : false,
    resources,
  });
  const sweepers = {
    expiry: app.get(ExpirySweeper),
    gaps: app.get(GapSweeper),
    orphans: app.get(OrphanSweeper),
  };
  const memoryTransport = target === 'embedded' ? (transport as InMemoryTransport) : undefined;
  return {
    target,
    app,
    channels: channels,
    producer,
    splitter: app.get(SplitterService),
    claimCheck: app.get(ClaimCheckService),
    sequenceStore: app.get<SequenceStore>(SEQUENCE_STORE),
    resequencerStore: app.get<ResequencerStore>(RESEQUENCER_STORE),
    metrics: app.get(ModuleMetrics),
    reassembled: app.get(Reassemble),
    streamed: app.get(Stream),
    claimed: app.get(Claim),
    ordered: app.get(Ordered),
    inboxed: app.get(Inbox),
    redis,
    async takeDeadLetters(channel) {
      const dlq = transport.deadLetterChannel(channel);
      if (memoryTransport) return memoryTransport.take(dlq);
      return admin!.drain(dlq);
    },
    async pending(channel) {
      if (memoryTransport) {
        return memoryTransport.depth(channel) + memoryTransport.unsettled(channel);
      }
      return admin!.readyCount(channel);
    },
    async sweep(now) {
      await sweepers.expiry.sweep(now);
      await sweepers.gaps.sweep(now);
      await sweepers.orphans.sweep(now);
    },
    sweepers,
    close: async () => {
      await close();
      if (redis) await deleteUnder(redis.client, redis.prefix).catch(() => undefined);
    },
  };
}

/** Redis's view of the app's prefix: keys and the bytes they take. */
export interface RedisSample {
  readonly keys: string[];
  readonly bytes: number;
}

export async function sampleRedis(client: Redis, prefix: string): Promise<RedisSample> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await client.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  const pipeline = client.pipeline();
  for (const key of keys) pipeline.memory('USAGE', key);
  const usage = ((await pipeline.exec()) ?? []).map(([, value]) => Number(value ?? 0));
  return { keys, bytes: usage.reduce((sum, each) => sum + each, 0) };
}

export { MiB, KiB };
