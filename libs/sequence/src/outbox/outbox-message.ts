import {
  IsDefined,
  IsISO8601,
  IsOptional,
  IsString,
  Length,
  Matches,
  ValidateIf,
} from 'class-validator';

/** Message ids: 1–200 characters, no control characters. */
// eslint-disable-next-line no-control-regex -- refusing control characters is the point
export const MESSAGE_ID_PATTERN = /^[^\u0000-\u001f\u007f]{1,200}$/;
/** Type names (`OrderPlaced`, `billing.ArchiveTask`). */
export const MESSAGE_TYPE_PATTERN = /^[A-Za-z][A-Za-z0-9_.:-]{0,199}$/;
/** Service names, used in channel names (`commands.<targetService>`). */
export const SERVICE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/;

/**
 * What events and commands share: a stable id and a type name. Not a message of its own: each
 * kind below adds the fields that make it one (class-validator checks the fields of both
 * classes). The fields are declared in the order a relayed body lists them: these two first.
 */
export abstract class OutboxMessageFields {
  /** Stable across retries and redeliveries: the inbox deduplicates by it. */
  @Matches(MESSAGE_ID_PATTERN, { message: 'id must be 1-200 characters, no control characters' })
  @IsString()
  id!: string;

  @Matches(MESSAGE_TYPE_PATTERN, {
    message: 'type must start with a letter and hold only letters, digits and _ . : -',
  })
  @IsString()
  type!: string;
}

/**
 * A domain event: a fact that happened to an aggregate, addressed to no one. Validated with
 * class-validator; a command's fields (`targetService`) are refused on it.
 */
export class OutboxEvent<Payload = unknown> extends OutboxMessageFields {
  @Length(1, 200)
  @IsString()
  aggregateType!: string;

  @Length(1, 200)
  @IsString()
  aggregateId!: string;

  /** Any JSON value. */
  @IsDefined()
  payload!: Payload;

  /** When it happened (ISO-8601). */
  @IsISO8601({ strict: true })
  occurredAt!: string;

  @IsOptional()
  @Length(1, 200)
  @IsString()
  tenantId?: string;
}

/** A command: an intention directed at one service, emitted by no aggregate. */
export class OutboxCommand<Payload = unknown> extends OutboxMessageFields {
  @Matches(SERVICE_NAME_PATTERN, {
    message: 'targetService must be 1-100 letters, digits, _ . - (it names a channel)',
  })
  @IsString()
  targetService!: string;

  @ValidateIf((command: OutboxCommand) => command.targetTenantId !== undefined)
  @Length(1, 200)
  @IsString()
  targetTenantId?: string;

  /** Any JSON value. */
  @IsDefined()
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
