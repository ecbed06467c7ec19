import { randomUUID } from 'node:crypto';
import type { Type } from '@nestjs/common';
import { MESSAGE_ID_HEADER } from 'nest-sequence/wire';
import { PostgresOutboxStore, type PostgresOutboxConnectOptions } from 'nest-sequence/postgres';
import type { Transport } from 'nest-sequence';
import { type EventInput } from '../../../src/core/outbox-message';
import type { BoxOptions, OutboxOptions } from '../../../src/options/outbox.options';
import { SERVERS } from '../../support/servers';
import { createOutboxTestApp, type OutboxTestApp } from '../../outbox/outbox-test-app';
import { namedTransport, type QueuedMessage } from '../../support/rabbitmq.fixture';
import type { SequenceModuleOptions } from '../../../src/options/module-options';
import { mergeOptions } from '../../support/merge-options';
import type { TransportCase } from '../../support/transports.fixture';

/** Relay settings quick enough for tests: polls every 100 ms, retries within 100 ms. */
export const FAST_RELAY = {
  pollIntervalMs: 100,
  retry: { baseDelayMs: 20, maxDelayMs: 100 },
} satisfies BoxOptions;

export interface PostgresOutboxApp extends OutboxTestApp {
  /** The app's store: tables `<tablePrefix><box>` on the server of `databaseUrl`. */
  readonly store: PostgresOutboxStore;
  /** The `application_name` of the store's pool connections (to find them in pg_stat_activity). */
  readonly applicationName: string;
}

export interface PostgresOutboxAppSettings {
  readonly tablePrefix: string;
  /** @default SERVERS.postgres.url */
  readonly databaseUrl?: string;
  readonly outbox?: Omit<OutboxOptions, 'store'>;
  /** Other module options (the purge is off unless `tuning.sweepers.purge` turns it on). */
  readonly module?: Omit<SequenceModuleOptions, 'outbox' | 'transport'>;
  readonly providers?: Type[];
  /** Settings of the store's pool (`application_name` is set to a name of its own). */
  readonly pool?: PostgresOutboxConnectOptions['pool'];
  /** The broker. @default RabbitMQ */
  readonly on?: TransportCase;
}

/**
 * An application in this process with SequenceModule on RabbitMQ, or `on`'s broker (a named
 * connection of its own), and a PostgresOutboxStore with a pool of its own, through
 * `createOutboxTestApp` (so its transport takes `beforePublish` faults). Purging is off.
 * `close()` closes the application, the transport and the store.
 */
export async function createPostgresOutboxApp(
  settings: PostgresOutboxAppSettings,
): Promise<PostgresOutboxApp> {
  const applicationName = `nseq-fault-${settings.tablePrefix}${randomUUID().slice(0, 8)}`;
  const store = PostgresOutboxStore.connect(settings.databaseUrl ?? SERVERS.postgres.url, {
    tablePrefix: settings.tablePrefix,
    pool: { ...settings.pool, application_name: applicationName },
  });
  let broker: Transport | undefined;
  try {
    const connectionName = `nseq-fault-outbox-${randomUUID()}`;
    broker = settings.on
      ? await settings.on.connect(connectionName)
      : await namedTransport(connectionName);
    const app = await createOutboxTestApp({ ...settings.outbox, store }, settings.providers ?? [], {
      broker,
      ...mergeOptions<Omit<SequenceModuleOptions, 'outbox' | 'transport'>>(
        { tuning: { sweepers: { purge: { intervalMs: false } } } },
        settings.module ?? {},
      ),
    });
    return {
      ...app,
      store,
      applicationName,
      close: async () => {
        try {
          await app.close();
        } finally {
          await store.close();
        }
      },
    };
  } catch (error) {
    await broker?.close();
    await store.close();
    throw error;
  }
}

/** An OrderPlaced event of order `orderId` (its own aggregate unless `aggregateId` says). */
export function orderPlaced(
  id: string,
  aggregateId: string = id,
  payload: Record<string, unknown> = {},
): EventInput<Record<string, unknown>> {
  return { id, type: 'OrderPlaced', aggregateType: 'Order', aggregateId, payload };
}

/** The message ids (`x-message-id`) of messages read off a queue, in arrival order. */
export function messageIds(messages: readonly QueuedMessage[]): string[] {
  return messages.map(({ headers }) => String(headers[MESSAGE_ID_HEADER]));
}

/** How many copies of each id there are, by id. */
export function copiesById(ids: readonly string[]): Record<string, number> {
  const copies: Record<string, number> = {};
  for (const id of ids) copies[id] = (copies[id] ?? 0) + 1;
  return copies;
}

/** `{ id: copies }` for every id of `ids`: what `copiesById` gives when each arrived `copies` times. */
export function eachTimes(ids: readonly string[], copies: number): Record<string, number> {
  return Object.fromEntries(ids.map((id) => [id, copies]));
}
