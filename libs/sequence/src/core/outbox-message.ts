/** Message ids: 1–200 characters, no control characters. */
// eslint-disable-next-line no-control-regex -- refusing control characters is the point
export const MESSAGE_ID_PATTERN = /^[^\u0000-\u001f\u007f]{1,200}$/;
/** Type names (`OrderPlaced`, `billing.ArchiveTask`). */
export const MESSAGE_TYPE_PATTERN = /^[A-Za-z][A-Za-z0-9_.:-]{0,199}$/;
/** Service names, used in channel names (`commands.<targetService>`). */
export const SERVICE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/;

/**
 * What events and commands share: a stable id and a type name. Not a message of its own: each
 * kind below adds the fields that make it one. The fields are declared in the order a relayed
 * body lists them: these two first.
 *
 * Both kinds are validated with class-validator. Its rules (`outbox-message.rules.ts`) are attached
 * to these classes when the library first needs them (recording or receiving a message, or the
 * module starting with an outbox), not when the library is imported: class-validator costs an
 * application that never uses the outbox about 8 MiB of memory.
 */
export abstract class OutboxMessageFields {
  /** Stable across retries and redeliveries: the inbox deduplicates by it. */
  id!: string;

  type!: string;
}

/**
 * A domain event: a fact that happened to an aggregate, addressed to no one. Validated with
 * class-validator; a command's fields (`targetService`) are refused on it.
 */
export class OutboxEvent<Payload = unknown> extends OutboxMessageFields {
  aggregateType!: string;

  aggregateId!: string;

  /** Any JSON value. */
  payload!: Payload;

  /** When it happened (ISO-8601). */
  occurredAt!: string;

  tenantId?: string;
}

/** A command: an intention directed at one service, emitted by no aggregate. */
export class OutboxCommand<Payload = unknown> extends OutboxMessageFields {
  targetService!: string;

  targetTenantId?: string;

  /** Any JSON value. */
  payload!: Payload;
}

/** What `publishEvent` takes: `id` defaults to a new UUID, `occurredAt` to now. */
export interface EventInput<Payload = unknown> {
  readonly id?: string;
  readonly type: string;
  readonly aggregateType: string;
  readonly aggregateId: string | number;
  readonly payload: Payload;
  readonly occurredAt?: Date | string;
  readonly tenantId?: string;
}

/** What `sendCommand` takes: `id` defaults to a new UUID. */
export interface CommandInput<Payload = unknown> {
  readonly id?: string;
  readonly type: string;
  readonly targetService: string;
  readonly targetTenantId?: string;
  readonly payload: Payload;
}
