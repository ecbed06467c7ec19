import { Injectable, type INestApplicationContext, type Provider, type Type } from '@nestjs/common';
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import type { Registry } from 'prom-client';
import { RESOLVED_OPTIONS } from '../../src/kernel/tokens';
import type { ResolvedOptions } from '../../src/options/resolved-options';
import {
  ClaimCheck,
  ClaimCheckService,
  ClaimedPayload,
  FilesystemPayloadStore,
  InMemoryTransport,
  type ClaimCheckHandlerOptions,
  type Disposition,
  type HandlerContext,
  type PayloadStore,
  type SequenceModuleOptions,
  type Subscription,
  type Transport,
} from 'nest-sequence';
import { OrphanSweeper } from '../../src/claim-check/orphan.sweeper';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import {
  signTicket,
  type ClaimTicket,
  type ClaimTicketFields,
  type HeaderMap,
} from 'nest-sequence/wire';
import { type ClaimCheckOptions } from '../../src/options/claim-check.options';
import { type MessageHandler, type SubscribeOptions } from 'nest-sequence/ports';
import { serializeTicket } from '../../src/core/claim-ticket';
import { metricValue } from '../support/sequence-test-app';
import { mergeOptions } from '../support/merge-options';
import { createTestApp } from '../support/test-app';

/** What a test handler got from one successful call. */
export interface ClaimDeliveryRecord {
  readonly payload: ClaimedPayload;
  readonly bytes: Buffer;
}

/**
 * A `@ClaimCheck` handler for tests: counts calls, reads each payload (whole, by default) and
 * records it; can be told to fail its next calls or to read another way.
 */
export class RecordingClaimHandler {
  readonly deliveries: ClaimDeliveryRecord[] = [];
  /** Errors the read threw (e.g. an integrity failure at the end of the stream). */
  readonly readErrors: unknown[] = [];
  calls = 0;
  /** Number of upcoming calls that throw before reading. */
  failNext = 0;
  /** How a call reads its payload. */
  read: (payload: ClaimedPayload) => Promise<Buffer> = (payload) => payload.toBuffer();

  /** Awaited at the start of every call (after counting it), e.g. to hold the handler mid-call. */
  onCall?: (payload: ClaimedPayload, context: HandlerContext) => Promise<void>;

  async handle(payload: ClaimedPayload, context: HandlerContext): Promise<void> {
    this.calls++;
    await this.onCall?.(payload, context);
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error(`handler failure #${this.calls} (expected by the test)`);
    }
    let bytes: Buffer;
    try {
      bytes = await this.read(payload);
    } catch (error) {
      this.readErrors.push(error);
      throw error;
    }
    this.deliveries.push({ payload, bytes });
  }
}

/** A provider class whose `handle` is a `@ClaimCheck` handler with `options`. */
export function recordingClaimHandler(
  options: ClaimCheckHandlerOptions,
): Type<RecordingClaimHandler> {
  @Injectable()
  class Handler extends RecordingClaimHandler {
    @ClaimCheck(options)
    override async handle(payload: ClaimedPayload, context: HandlerContext): Promise<void> {
      await super.handle(payload, context);
    }
  }
  return Handler;
}

/** One settlement a subscriber decided, as the transport saw it. */
export interface Settlement {
  readonly channel: string;
  readonly disposition: Disposition;
}

/**
 * The in-memory transport, unchanged, that also records how subscribers settled each message:
 * tests can then tell an ack from a requeue without looking inside the receiver.
 */
export class SettlementRecordingTransport extends InMemoryTransport {
  readonly settlements: Settlement[] = [];

  override subscribe(
    channel: string,
    handler: MessageHandler,
    options?: SubscribeOptions,
  ): Promise<Subscription> {
    return super.subscribe(
      channel,
      async (message) => {
        const disposition = await handler(message);
        this.settlements.push({ channel, disposition });
        return disposition;
      },
      options,
    );
  }

  /** The actions taken on `channel`, in order. */
  actionsOn(channel: string): Array<Disposition['action']> {
    return this.settlements
      .filter((settlement) => settlement.channel === channel)
      .map((settlement) => settlement.disposition.action);
  }
}

export interface ClaimCheckTestAppOptions {
  /** One recording handler per entry. @default one handler on `cc.test` */
  handlers?: ClaimCheckHandlerOptions[];
  /** Claim Check options; `store` defaults to a FilesystemPayloadStore under the temp root. */
  claimCheck?: ClaimCheckOptions;
  /** Wraps the default filesystem store (e.g. to inject faults) before the module gets it. */
  wrapStore?: (store: FilesystemPayloadStore) => PayloadStore;
  /** More stores tickets may name (`claimCheck.readStores`), made with the app's temp dir. */
  readStores?: (dir: string) => PayloadStore[];
  /** Wraps the in-memory transport (e.g. a FaultInjectingTransport) before the module gets it. */
  wrapTransport?: (transport: InMemoryTransport) => Transport;
  /** Other module options. */
  module?: Omit<SequenceModuleOptions, 'transport' | 'claimCheck'>;
  providers?: Provider[];
}

export interface ClaimCheckTestApp {
  readonly app: INestApplicationContext;
  readonly transport: SettlementRecordingTransport;
  /** The temp directory; the store's root is `<dir>/root`, so files can be planted beside it. */
  readonly dir: string;
  readonly root: string;
  /** The filesystem store under `root`, unwrapped. */
  readonly store: FilesystemPayloadStore;
  readonly claimCheck: ClaimCheckService;
  readonly sweeper: OrphanSweeper;
  /** The module's options, resolved. */
  readonly options: ResolvedOptions;
  readonly registry: Registry;
  /** The handler of the first channel. */
  readonly handler: RecordingClaimHandler;
  readonly channel: string;
  handlerOn(channel: string): RecordingClaimHandler;
  close(): Promise<void>;
}

export const DEFAULT_CHANNEL = 'cc.test';

/**
 * A Nest application with SequenceModule on the embedded defaults (in-memory transport,
 * filesystem payload store under a fresh temp root, memory claim ledger), timers off unless
 * `module.tuning.sweepers` turns one on (tests call `sweeper.sweep(now)` themselves), and
 * recording `@ClaimCheck` handlers. `close()` removes the
 * temp directory too; a failed boot removes it before rethrowing.
 */
export async function createClaimCheckTestApp(
  options: ClaimCheckTestAppOptions = {},
): Promise<ClaimCheckTestApp> {
  const dir = await mkdtemp(join(tmpdir(), 'cc-guarantees-'));
  const root = join(dir, 'root');
  await mkdir(root);
  const transport = new SettlementRecordingTransport();
  const store = new FilesystemPayloadStore({ root });
  const handlerOptions = options.handlers ?? [{ channel: DEFAULT_CHANNEL }];
  const handlerClasses = handlerOptions.map((handler) => recordingClaimHandler(handler));
  const { app, close } = await createTestApp({
    sequence: mergeOptions<SequenceModuleOptions>(
      {
        handlerRetry: { attempts: 3, baseDelayMs: 1 },
        tuning: {
          sweepers: { expiry: { intervalMs: false }, orphans: { intervalMs: false } },
          backpressureDelayMs: 10,
        },
      },
      {
        ...options.module,
        transport: options.wrapTransport?.(transport) ?? transport,
        claimCheck: {
          store: options.wrapStore?.(store) ?? store,
          readStores: options.readStores?.(dir),
          ...options.claimCheck,
        },
      },
    ),
    providers: [...handlerClasses, ...(options.providers ?? [])],
    logger: false,
    resources: [() => rm(dir, { recursive: true, force: true }), () => transport.close()],
  });
  const handlers = new Map(
    handlerOptions.map((handler, index) => [
      handler.channel,
      app.get<RecordingClaimHandler>(handlerClasses[index]),
    ]),
  );
  const handlerOn = (channel: string): RecordingClaimHandler => {
    const handler = handlers.get(channel);
    if (!handler) throw new Error(`no test handler on ${channel}`);
    return handler;
  };
  return {
    app,
    transport,
    dir,
    root,
    store,
    claimCheck: app.get(ClaimCheckService),
    sweeper: app.get(OrphanSweeper),
    options: app.get<ResolvedOptions>(RESOLVED_OPTIONS),
    registry: app.get(ModuleMetrics).registry,
    handler: handlerOn(handlerOptions[0].channel),
    channel: handlerOptions[0].channel,
    handlerOn,
    close,
  };
}

/** Publishes a ticket (or any body) as a ticket message: `x-claim-check: 1`. */
export function publishTicket(
  transport: Transport,
  channel: string,
  ticket: ClaimTicket | Record<string, unknown> | Buffer,
  headers: HeaderMap = {},
): Promise<void> {
  const body = Buffer.isBuffer(ticket)
    ? ticket
    : serializeTicket(ticket as ClaimTicket /* any JSON object serializes the same way */);
  return transport.publish(channel, body, { ...headers, 'x-claim-check': 1 });
}

/** The fields a sender decides, from a signed ticket: to change one and sign again. */
export function fieldsOf(ticket: ClaimTicket): ClaimTicketFields {
  const { v: _v, kid: _kid, sig: _sig, audience, ...fields } = ticket;
  return { ...fields, audience: audience ?? [] };
}

/** Signs `fields` with the application's own keyring: a ticket it will accept as genuine. */
export function signedByApp(
  t: Pick<ClaimCheckTestApp, 'options'>,
  fields: ClaimTicketFields,
): ClaimTicket {
  return signTicket(fields, t.options.claimCheck.keyring);
}

/** Every regular file under `root`, relative to it, sorted: what the store holds on disk. */
export async function filesUnder(root: string): Promise<string[]> {
  const entries = await readdir(root, { recursive: true, withFileTypes: true });
  return entries
    .filter((entry) => entry.isFile() || entry.isSymbolicLink())
    .map((entry) => relative(root, join(entry.parentPath, entry.name)))
    .sort();
}

/** A Claim Check metric of the app, by its name without the `nest_sequence_` prefix. */
export function claimMetric(
  t: Pick<ClaimCheckTestApp, 'registry'>,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  return metricValue(t.registry, `nest_sequence_claim_check_${name}`, labels);
}

/** The dead letters of `channel` with their reasons. */
export function deathReasons(transport: InMemoryTransport, channel: string): string[] {
  return transport
    .peek(`${channel}.dlq`)
    .map((message) => String(message.headers['x-death-reason']));
}
