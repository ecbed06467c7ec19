import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { Injectable, type INestApplicationContext, type Type } from '@nestjs/common';
import type { Registry } from 'prom-client';
import {
  ClaimCheck,
  ClaimCheckService,
  ClaimedPayload,
  type ClaimCheckHandlerOptions,
  type PayloadStore,
  type Transport,
} from 'nest-sequence';
import type { ClaimLedger } from 'nest-sequence/ports';
import { OrphanSweeper } from '../../../src/claim-check/orphan.sweeper';
import { RedisClaimLedger, RedisPayloadStore } from 'nest-sequence/redis';
import { ModuleMetrics } from '../../../src/kernel/module-metrics';
import { type ClaimDelivery } from '../../../src/claim-check/claimed-payload';
import { type ClaimTicket, type ClaimTicketKey, type HeaderMap } from 'nest-sequence/wire';
import type { PublishPolicy } from '../../../src/options/module-options';
import { SERVERS } from '../../support/servers';
import { closeAll, createTestApp, type Closer } from '../../support/test-app';
import { namedTransport } from '../../support/rabbitmq.fixture';
import type { TransportCase } from '../../support/transports.fixture';

/**
 * The ticket keys of every app a spec file makes: producers and consumers must share them, as
 * separate processes would through their configuration.
 */
export const SIGNING_KEYS: ClaimTicketKey[] = [{ id: 'fault-tests', secret: randomBytes(32) }];

/** What a recording `@ClaimCheck` handler saw of one delivery it read to the end. */
export interface ClaimRecord {
  readonly via: ClaimDelivery;
  readonly bytes: number;
  readonly sha256: string;
  readonly headers: Readonly<HeaderMap>;
  readonly ticket?: ClaimTicket;
}

/**
 * A `@ClaimCheck` handler for tests: streams every payload through a SHA-256 (never holding a
 * large one whole) and records it once the stream ended cleanly, i.e. once the library verified
 * it. A call whose read failed is counted in `calls`, not in `deliveries`.
 */
export class RecordingClaimHandler {
  readonly deliveries: ClaimRecord[] = [];
  calls = 0;
  /** Awaited at the start of every call (after counting it), e.g. to hold the handler. */
  onCall?: (payload: ClaimedPayload) => Promise<void>;
  /** Awaited after each chunk read, with the bytes read so far in this call. */
  onChunk?: (bytesRead: number) => Promise<void> | void;

  async handle(payload: ClaimedPayload): Promise<void> {
    this.calls++;
    await this.onCall?.(payload);
    const hash = createHash('sha256');
    let bytes = 0;
    for await (const chunk of payload.stream()) {
      hash.update(chunk as Buffer);
      bytes += (chunk as Buffer).length;
      await this.onChunk?.(bytes);
    }
    this.deliveries.push({
      via: payload.via,
      bytes,
      sha256: hash.digest('hex'),
      headers: payload.headers,
      ticket: payload.ticket,
    });
  }
}

function recordingClaimHandler(options: ClaimCheckHandlerOptions): Type<RecordingClaimHandler> {
  @Injectable()
  class Handler extends RecordingClaimHandler {
    @ClaimCheck(options)
    override async handle(payload: ClaimedPayload): Promise<void> {
      await super.handle(payload);
    }
  }
  return Handler;
}

export interface ClaimCheckApp {
  readonly app: INestApplicationContext;
  readonly transport: Transport;
  /** The name the broker lists this app's connection under (client property `connection_name`). */
  readonly connectionName: string;
  readonly claimCheck: ClaimCheckService;
  readonly sweeper: OrphanSweeper;
  readonly registry: Registry;
  /** The recording handler of the `consume` channel (without one: a handler nothing calls). */
  readonly handler: RecordingClaimHandler;
  close(): Promise<void>;
}

export interface ClaimCheckAppOptions {
  /** The payload store: handed over, `close()` closes it (a no-op for a client passed in). */
  readonly store: PayloadStore;
  /** The claim ledger: handed over like the store. */
  readonly ledger: ClaimLedger;
  /** A recording `@ClaimCheck` handler on this channel (with these options); none if absent. */
  readonly consume?: ClaimCheckHandlerOptions;
  readonly threshold?: number;
  readonly publish?: PublishPolicy;
  /** @default 100 */
  readonly backpressureDelayMs?: number;
  readonly leaseMs?: number;
  /** @default 0.2 */
  readonly reconnectSeconds?: number;
  /** The broker. @default RabbitMQ */
  readonly on?: TransportCase;
  /** `claimCheck.acceptTicketsWithoutAudience`. @default the module's (false) */
  readonly acceptTicketsWithoutAudience?: boolean;
}

/**
 * A Nest application with SequenceModule on the real RabbitMQ, or `on`'s broker (a connection
 * of its own, named for the broker) and Claim Check on the given store and ledger, signing with
 * {@link SIGNING_KEYS}. Timers are off: tests call `sweeper.sweep(now)` themselves. `close()`
 * closes the application, then its transport, store and ledger.
 */
export async function createClaimCheckApp(options: ClaimCheckAppOptions): Promise<ClaimCheckApp> {
  const connectionName = `nseq-fault-cc-${randomUUID()}`;
  // Closed last first: the transport, then the store, then the ledger.
  const resources: Closer[] = [() => options.ledger.close(), () => options.store.close()];
  let transport: Transport;
  const reconnectSeconds = options.reconnectSeconds ?? 0.2;
  try {
    transport = options.on
      ? await options.on.connect(connectionName, { reconnectMs: reconnectSeconds * 1_000 })
      : await namedTransport(connectionName, { reconnectSeconds });
  } catch (error) {
    await closeAll(resources);
    throw error;
  }
  resources.push(() => transport.close());
  const Handler = options.consume ? recordingClaimHandler(options.consume) : undefined;
  const { app, close } = await createTestApp({
    sequence: {
      transport,
      publish: options.publish,
      claimCheck: {
        store: options.store,
        ledger: options.ledger,
        signingKeys: SIGNING_KEYS,
        inlineMaxBytes: options.threshold,
        acceptTicketsWithoutAudience: options.acceptTicketsWithoutAudience,
      },
      tuning: {
        sweepers: { orphans: { intervalMs: false }, expiry: { intervalMs: false } },
        backpressureDelayMs: options.backpressureDelayMs ?? 100,
        leaseMs: options.leaseMs,
      },
    },
    providers: Handler ? [Handler] : [],
    logger: process.env.FAULT_TEST_LOGS ? ['log', 'warn', 'error'] : false,
    resources,
  });
  return {
    app,
    transport,
    connectionName,
    claimCheck: app.get(ClaimCheckService),
    sweeper: app.get(OrphanSweeper),
    registry: app.get(ModuleMetrics).registry,
    handler: Handler ? app.get(Handler) : new RecordingClaimHandler(),
    close,
  };
}

/** A Redis payload store and a Redis claim ledger under `prefix`, each with a client of its own. */
export function redisClaimCheckAdapters(
  prefix: string,
  redisUrl: string = SERVERS.redis.url,
): { store: RedisPayloadStore; ledger: RedisClaimLedger } {
  return {
    store: RedisPayloadStore.connect(redisUrl, { prefix }),
    ledger: RedisClaimLedger.connect(redisUrl, { prefix }),
  };
}

/** The keys of one Redis payload (meta hash and chunks), as RedisPayloadStore names them. */
export function payloadKeyPattern(prefix: string, ref: string): string {
  return `${prefix}:{payload:${ref}}:*`;
}

/**
 * `bytes` deterministic pseudo-random bytes as a stream of `chunkBytes` chunks, generated as
 * they are read (never held whole), with the SHA-256 they will have.
 */
export function generatedPayload(
  bytes: number,
  seed: number,
  chunkBytes = 64 * 1024,
): { stream: () => Readable; sha256: string; bytes: number } {
  const chunkAt = (offset: number) => {
    const length = Math.min(chunkBytes, bytes - offset);
    const chunk = Buffer.allocUnsafe(length);
    // xorshift32 from the seed and the offset: cheap, and unlike a repeated pattern it makes any
    // chunk swap or misplaced chunk visible in the digest.
    let state = (seed * 2654435761 + offset) >>> 0 || 1;
    for (let i = 0; i < length; i++) {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      state >>>= 0;
      chunk[i] = state & 0xff;
    }
    return chunk;
  };
  const hash = createHash('sha256');
  for (let offset = 0; offset < bytes; offset += chunkBytes) hash.update(chunkAt(offset));
  return {
    bytes,
    sha256: hash.digest('hex'),
    stream: () =>
      Readable.from(
        (function* () {
          for (let offset = 0; offset < bytes; offset += chunkBytes) yield chunkAt(offset);
        })(),
        { objectMode: false },
      ),
  };
}
