import { Injectable, type INestApplicationContext, type Type } from '@nestjs/common';
import {
  InboxHandler,
  InMemoryTransport,
  OutboxService,
  type InboxContext,
  type InboxHandlerOptions,
  type OutboxCommand,
  type OutboxEvent,
  type SequenceModuleOptions,
  type Transport,
} from 'nest-sequence';
import { randomUUID } from 'node:crypto';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER } from 'nest-sequence/wire';
import type { HeaderMap } from '../../src/core/headers';
import { OutboxRuntime } from '../../src/outbox/outbox.runtime';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import type { BoxOptions, OutboxOptions } from '../../src/options/outbox.options';
import { FaultInjectingTransport } from '../support/sequence-test-app';
import { mergeOptions } from '../support/merge-options';
import { createTestApp } from '../support/test-app';

/** One call of a recording inbox handler. */
export interface InboxCall {
  readonly id: string;
  readonly type: string;
  readonly payload: unknown;
  readonly attempt: number;
  readonly inTransaction: boolean;
}

/** An `@InboxHandler` for tests: records every call; `onCall` may write, throw or wait. */
export class RecordingInboxHandler {
  readonly calls: InboxCall[] = [];
  onCall?: (message: OutboxEvent | OutboxCommand, context: InboxContext) => unknown;

  async handle(message: OutboxEvent | OutboxCommand, context: InboxContext): Promise<void> {
    this.calls.push({
      id: message.id,
      type: message.type,
      payload: message.payload,
      attempt: context.attempt,
      inTransaction: context.transaction !== undefined,
    });
    await this.onCall?.(message, context);
  }

  /** How many calls each message id had. */
  callsPerId(): Map<string, number> {
    const counts = new Map<string, number>();
    for (const { id } of this.calls) counts.set(id, (counts.get(id) ?? 0) + 1);
    return counts;
  }
}

/** A provider class whose `handle` method carries `@InboxHandler(options)`. */
export function inboxHandler(options: InboxHandlerOptions): Type<RecordingInboxHandler> {
  @Injectable()
  class Handler extends RecordingInboxHandler {
    @InboxHandler(options)
    override async handle(message: OutboxEvent | OutboxCommand, context: InboxContext) {
      await super.handle(message, context);
    }
  }
  return Handler;
}

export interface OutboxTestApp {
  readonly app: INestApplicationContext;
  readonly outbox: OutboxService;
  readonly runtime: OutboxRuntime;
  /** The in-memory broker underneath `transport`. */
  readonly broker: InMemoryTransport;
  /** What the module publishes through: faults can be injected with `beforePublish`. */
  readonly transport: FaultInjectingTransport;
  readonly metrics: ModuleMetrics;
  handler<T extends RecordingInboxHandler>(type: Type<T>): T;
  close(): Promise<void>;
}

/** Quick loops, short backoff: what the tests need to see retries within a second. */
/**
 * An inbox handler of PaymentSettled events (payload `{ n }`) that writes ledger entry n through
 * the claim's transaction with `insert` (parameters: n, then the account): entry 1 names account
 * `missing`, the others `main`. `calls` counts its calls per n.
 */
export function ledgerWriter(insert: string): { Ledger: Type; calls: Map<number, number> } {
  const calls = new Map<number, number>();
  @Injectable()
  class Ledger {
    @InboxHandler({ event: 'PaymentSettled', processInTransaction: true })
    async handle(event: OutboxEvent<{ n: number }>, { transaction }: InboxContext) {
      const { n } = event.payload;
      calls.set(n, (calls.get(n) ?? 0) + 1);
      await transaction!.query(insert, [n, n === 1 ? 'missing' : 'main']);
    }
  }
  return { Ledger, calls };
}

export const FAST_BOX = {
  pollIntervalMs: 50,
  retry: { baseDelayMs: 10, maxDelayMs: 40 },
} satisfies BoxOptions;

/**
 * An application with SequenceModule on the in-memory transport (or `broker`) and the given
 * outbox options (the embedded SQLite store unless `outbox.store` is set), plus `providers`.
 */
export async function createOutboxTestApp(
  outbox: OutboxOptions | undefined,
  providers: Type[] = [],
  extra: Omit<SequenceModuleOptions, 'outbox' | 'transport'> & { broker?: Transport } = {},
): Promise<OutboxTestApp> {
  const { broker = new InMemoryTransport(), ...moduleOptions } = extra;
  const transport = new FaultInjectingTransport(broker);
  const { app, own, close } = await createTestApp({
    sequence: mergeOptions<SequenceModuleOptions>(
      { ...moduleOptions, transport, outbox },
      { tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } } },
    ),
    providers,
    logger: process.env.TEST_LOGS ? ['log', 'warn', 'error'] : false,
  });
  // Closed with the app, not when the boot fails: a broker the caller passed is then its own.
  own(() => broker.close());
  return {
    app,
    outbox: app.get(OutboxService),
    runtime: app.get(OutboxRuntime),
    broker: broker as InMemoryTransport,
    transport,
    metrics: app.get(ModuleMetrics),
    handler: (type) => app.get(type),
    close,
  };
}

/**
 * Publishes an event on `events.<type>` as another service's relay would: its JSON (a fresh id,
 * `occurredAt` now, the aggregate and payload given) with the id and kind headers, plus
 * `headers`. Resolves with the event's id.
 */
export async function publishInboxEvent(
  broker: Transport,
  type: string,
  event: {
    readonly aggregateType: string;
    readonly aggregateId: string;
    readonly payload?: unknown;
  },
  headers: HeaderMap = {},
): Promise<string> {
  const id = randomUUID();
  const body = {
    id,
    type,
    aggregateType: event.aggregateType,
    aggregateId: event.aggregateId,
    payload: event.payload ?? {},
    occurredAt: new Date().toISOString(),
  };
  await broker.publish(`events.${type}`, Buffer.from(JSON.stringify(body)), {
    [MESSAGE_ID_HEADER]: id,
    [MESSAGE_KIND_HEADER]: 'event',
    ...headers,
  });
  return id;
}
