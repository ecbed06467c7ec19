import { randomUUID } from 'node:crypto';
import type { ValidationError } from 'class-validator';
import { InvalidOutboxMessageError } from '../core/errors/invalid-outbox-message.error';
import { errorMessage } from '../core/errors/caught';
import { hasLoneSurrogate } from '../core/unicode';
import type { MessageKind, NewBoxRecord } from '../ports/outbox-store.port';
import {
  MESSAGE_TYPE_PATTERN,
  OutboxCommand,
  OutboxEvent,
  SERVICE_NAME_PATTERN,
  type CommandInput,
  type EventInput,
} from '../core/outbox-message';
import { messageValidation } from './outbox-message.rules';
import { OutboxTracing } from './outbox.tracing';
import { jsonText } from '../core/json-text';

/** Wire headers of a relayed message; the body is the message as JSON. */
export const MESSAGE_ID_HEADER = 'x-message-id';
export const MESSAGE_KIND_HEADER = 'x-message-kind';
export const MESSAGE_TYPE_HEADER = 'x-message-type';

const VALIDATION = {
  whitelist: true,
  forbidNonWhitelisted: true,
  forbidUnknownValues: true,
  validationError: { target: false, value: false },
} as const;

function problemsOf(errors: readonly ValidationError[], path = ''): string[] {
  return errors.flatMap((error) => {
    const where = path + error.property;
    const own = Object.values(error.constraints ?? {}).map((text) =>
      text.startsWith(error.property) ? `${path}${text}` : `${where}: ${text}`,
    );
    return [...own, ...problemsOf(error.children ?? [], `${where}.`)];
  });
}

/**
 * `payload` as the JSON it travels as (a copy, detached from the caller's objects), or the
 * problem: a value JSON cannot carry (BigInt, a cycle) or would carry as `{}` (a Map, a Set, a
 * Promise, an async iterable: see jsonText) is refused.
 */
function asJson(payload: unknown): { value?: unknown; problems: string[] } {
  try {
    const text = jsonText(payload);
    if (text === undefined) return { problems: ['payload must be a JSON value'] };
    // NaN, an invalid Date, a toJSON() answering null: JSON null, which every inbox refuses.
    if (text === 'null') return { problems: ['payload must not serialize to null'] };
    return { value: JSON.parse(text) as unknown, problems: [] };
  } catch (error) {
    return { problems: [`payload is not JSON-serializable (${errorMessage(error)})`] };
  }
}

/**
 * Printable ASCII, 1–200 characters: text every rule of the messages' string fields accepts
 * (their patterns, lengths, well-formed Unicode, no NUL), checked without class-validator.
 */
const PLAIN_TEXT = /^[\x20-\x7e]{1,200}$/;
/**
 * `Date.prototype.toISOString`'s form, years 1000–9999, which the ISO 8601 rule accepts. An
 * earlier year is left to the rule: its calendar check reads the year without leading zeros
 * (`99-12-31`), which `Date` takes for 1999, and so refuses such instants.
 */
const ISO_INSTANT = /^[1-9]\d{3}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/** What each field of a message must be for the quick check to vouch for it (else: the rules). */
const QUICK_FIELDS: Record<MessageKind, Readonly<Record<string, (value: unknown) => boolean>>> = {
  event: {
    id: (value) => typeof value === 'string' && PLAIN_TEXT.test(value),
    type: (value) => typeof value === 'string' && MESSAGE_TYPE_PATTERN.test(value),
    aggregateType: (value) => typeof value === 'string' && PLAIN_TEXT.test(value),
    aggregateId: (value) => typeof value === 'string' && PLAIN_TEXT.test(value),
    occurredAt: (value) =>
      typeof value === 'string' &&
      ISO_INSTANT.test(value) &&
      // A real calendar instant (no 30 February): what the strict ISO 8601 rule checks.
      new Date(value).toISOString() === value,
    tenantId: (value) =>
      value === undefined || (typeof value === 'string' && PLAIN_TEXT.test(value)),
  },
  command: {
    id: (value) => typeof value === 'string' && PLAIN_TEXT.test(value),
    type: (value) => typeof value === 'string' && MESSAGE_TYPE_PATTERN.test(value),
    targetService: (value) => typeof value === 'string' && SERVICE_NAME_PATTERN.test(value),
    targetTenantId: (value) =>
      value === undefined || (typeof value === 'string' && PLAIN_TEXT.test(value)),
  },
};

/**
 * The instance the rules would build from `fields`, when every field is plainly valid (the
 * common case: ids, names and times in printable ASCII, nothing unknown, every required field
 * there); `undefined` when unsure, and the rules then decide. class-validator and
 * class-transformer cost several times the rest of recording a message.
 */
function quicklyChecked<T>(
  kind: MessageKind,
  type: new () => T,
  fields: Record<string, unknown>,
): T | undefined {
  const checks = QUICK_FIELDS[kind];
  for (const name in checks) {
    if (!checks[name](fields[name])) return undefined;
  }
  for (const name in fields) {
    if (!Object.prototype.hasOwnProperty.call(checks, name)) return undefined;
  }
  // As class-transformer builds it: a new instance, each given field set in the given order.
  return Object.assign(new type() as object, fields) as T;
}

/** The message `plain` describes, checked by the quick check or else by the rules. */
function validated<T extends { payload: unknown }>(
  kind: MessageKind,
  type: new () => T,
  plain: unknown,
): T {
  if (typeof plain !== 'object' || plain === null || Array.isArray(plain)) {
    throw new InvalidOutboxMessageError(kind, [`a ${kind} must be an object`]);
  }
  const { payload, ...fields } = plain as Record<string, unknown>;
  if (payload !== undefined && payload !== null) {
    const quick = quicklyChecked(kind, type, fields);
    if (quick) {
      const json = asJson(payload);
      if (json.problems.length === 0) {
        quick.payload = json.value;
        return quick;
      }
    }
  }
  return validatedByRules(kind, type, plain);
}

/** The message `plain` describes, checked by the class-validator rules only. */
export function validatedByRules<T extends { payload: unknown }>(
  kind: MessageKind,
  type: new () => T,
  plain: unknown,
): T {
  if (typeof plain !== 'object' || plain === null || Array.isArray(plain)) {
    throw new InvalidOutboxMessageError(kind, [`a ${kind} must be an object`]);
  }
  const { payload, ...fields } = plain as Record<string, unknown>;
  const { plainToInstance, validateSync } = messageValidation();
  // The payload is the sender's and is checked as JSON only: class-transformer would rebuild it
  // (dropping keys named like Object.prototype's methods, calling class instances' constructors
  // without arguments). A stand-in keeps the rule that it must be given.
  const present = payload === undefined || payload === null ? payload : true;
  const instance = plainToInstance(type, { ...fields, payload: present });
  const problems = problemsOf(validateSync(instance, VALIDATION));
  // Databases store text as UTF-8, where every lone surrogate becomes U+FFFD (or the write
  // fails): two such ids would be one, and the second message a "duplicate".
  for (const [name, value] of Object.entries(fields)) {
    if (typeof value === 'string' && hasLoneSurrogate(value)) {
      problems.push(`${name} must be well-formed Unicode (it has a lone surrogate)`);
    }
  }
  // Fields stored as text in columns of their own (the payload is stored as JSON text, where it
  // is escaped): a NUL would fail the write at commit, and in an inbox batch, every record's.
  for (const [name, value] of Object.entries(fields)) {
    const saidAlready = problems.some((problem) => problem.startsWith(`${name} `));
    if (typeof value === 'string' && value.includes('\u0000') && !saidAlready) {
      problems.push(
        `${name} must not contain the NUL character (U+0000): databases refuse it in text`,
      );
    }
  }
  const json = asJson(payload);
  if (payload !== undefined && payload !== null) problems.push(...json.problems);
  if (problems.length > 0) {
    const id = (plain as { id?: unknown }).id;
    throw new InvalidOutboxMessageError(kind, problems, typeof id === 'string' ? id : undefined);
  }
  instance.payload = json.value;
  return instance;
}

/** The event `input` describes, with its defaults, validated. */
export function toEvent<Payload>(input: EventInput<Payload>): OutboxEvent<Payload> {
  const occurredAt = input.occurredAt ?? new Date();
  return validated('event', OutboxEvent, {
    ...input,
    id: input.id ?? randomUUID(),
    aggregateId:
      typeof input.aggregateId === 'number' ? String(input.aggregateId) : input.aggregateId,
    occurredAt:
      occurredAt instanceof Date && !Number.isNaN(occurredAt.getTime())
        ? occurredAt.toISOString()
        : occurredAt,
  }) as OutboxEvent<Payload>;
}

/** The command `input` describes, with its defaults, validated. */
export function toCommand<Payload>(input: CommandInput<Payload>): OutboxCommand<Payload> {
  return validated('command', OutboxCommand, {
    ...input,
    id: input.id ?? randomUUID(),
  }) as OutboxCommand<Payload>;
}

/** Events of one aggregate, and only they, share a partition: their order is kept when asked. */
export function partitionOf(event: Pick<OutboxEvent, 'aggregateType' | 'aggregateId'>): string {
  // JSON, not `type:id`: ('Order:eu', '1') and ('Order', 'eu:1') are two aggregates.
  return JSON.stringify([event.aggregateType, event.aggregateId]);
}

/**
 * The body relays send: the message's own fields, in a fixed order, without undefined ones. Its
 * payload is already a JSON copy (see `asJson`), so one serialization gives the text a round
 * trip through JSON would.
 */
function bodyOf(message: OutboxEvent | OutboxCommand): string {
  return JSON.stringify(message);
}

/** The box record of an event. */
export function eventRecord(
  event: OutboxEvent,
  headers: Readonly<Record<string, string>> = {},
): NewBoxRecord {
  return {
    id: event.id,
    kind: 'event',
    type: event.type,
    partitionKey: partitionOf(event),
    body: bodyOf(event),
    headers: OutboxTracing.recordHeaders(headers),
  };
}

/** The box record of a command. */
export function commandRecord(
  command: OutboxCommand,
  headers: Readonly<Record<string, string>> = {},
): NewBoxRecord {
  return {
    id: command.id,
    kind: 'command',
    type: command.type,
    partitionKey: null,
    body: bodyOf(command),
    headers: OutboxTracing.recordHeaders(headers),
  };
}

/** Parses and validates a message body of `kind` (what an inbox receives, or a stored record). */
export function parseMessage(kind: 'event', body: string): OutboxEvent;
export function parseMessage(kind: 'command', body: string): OutboxCommand;
export function parseMessage(kind: MessageKind, body: string): OutboxEvent | OutboxCommand;
export function parseMessage(kind: MessageKind, body: string): OutboxEvent | OutboxCommand {
  let plain: unknown;
  try {
    plain = JSON.parse(body);
  } catch (error) {
    throw new InvalidOutboxMessageError(kind, [`body is not JSON (${errorMessage(error)})`]);
  }
  return kind === 'event'
    ? validated('event', OutboxEvent, plain)
    : validated('command', OutboxCommand, plain);
}
