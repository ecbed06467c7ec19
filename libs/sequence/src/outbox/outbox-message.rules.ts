import type * as ClassTransformer from 'class-transformer';
import type * as ClassValidator from 'class-validator';
import {
  MESSAGE_ID_PATTERN,
  MESSAGE_TYPE_PATTERN,
  OutboxCommand,
  OutboxEvent,
  OutboxMessageFields,
  SERVICE_NAME_PATTERN,
} from '../core/outbox-message';

/** What the codec needs from class-validator and class-transformer. */
export interface MessageValidation {
  readonly plainToInstance: typeof ClassTransformer.plainToInstance;
  readonly validateSync: typeof ClassValidator.validateSync;
}

let loaded: MessageValidation | undefined;
/** Set before the rules are attached: a failure halfway must not attach the first ones twice. */
let attached = false;

/**
 * Loads class-validator and class-transformer and attaches the message rules to
 * {@link OutboxEvent} and {@link OutboxCommand}, once per process; later calls return the same
 * functions. Not at import time: an application that never records or receives an outbox message
 * does not pay for class-validator (about 8 MiB of RSS and 20 MiB of reserved V8 heap).
 */
export function messageValidation(): MessageValidation {
  if (loaded) return loaded;
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- loaded on first use, see above
  const validator = require('class-validator') as typeof ClassValidator;
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- loaded on first use, see above
  const transformer = require('class-transformer') as typeof ClassTransformer;
  if (!attached) {
    attached = true;
    attachRules(validator);
  }
  loaded = {
    plainToInstance: transformer.plainToInstance,
    validateSync: validator.validateSync,
  };
  return loaded;
}

/**
 * Attaches the class-validator rules to {@link OutboxEvent} and {@link OutboxCommand} now. The
 * library does it when an application with an outbox starts, or when it first records or receives
 * a message; call this to validate instances of those classes yourself before then (or in an
 * application that has no outbox). Idempotent.
 */
export function attachOutboxMessageRules(): void {
  messageValidation();
}

type PropertyRule = (target: object, property: string) => void;

/**
 * The rules of each field, applied in the order TypeScript applies a field's decorators (the one
 * nearest the field first), base class first: what `@Matches(…) @IsString() id` would register.
 */
function attachRules(v: typeof ClassValidator): void {
  const text = (more: PropertyRule[]): PropertyRule[] => [v.IsString(), ...more];
  const fields: [object, string, PropertyRule[]][] = [
    [
      OutboxMessageFields.prototype,
      'id',
      text([
        v.Matches(MESSAGE_ID_PATTERN, {
          message: 'id must be 1-200 characters, no control characters',
        }),
      ]),
    ],
    [
      OutboxMessageFields.prototype,
      'type',
      text([
        v.Matches(MESSAGE_TYPE_PATTERN, {
          message: 'type must start with a letter and hold only letters, digits and _ . : -',
        }),
      ]),
    ],
    [OutboxEvent.prototype, 'aggregateType', text([v.Length(1, 200)])],
    [OutboxEvent.prototype, 'aggregateId', text([v.Length(1, 200)])],
    [OutboxEvent.prototype, 'payload', [v.IsDefined()]],
    [OutboxEvent.prototype, 'occurredAt', [v.IsISO8601({ strict: true })]],
    [OutboxEvent.prototype, 'tenantId', text([v.Length(1, 200), v.IsOptional()])],
    [
      OutboxCommand.prototype,
      'targetService',
      text([
        v.Matches(SERVICE_NAME_PATTERN, {
          message: 'targetService must be 1-100 letters, digits, _ . - (it names a channel)',
        }),
      ]),
    ],
    [
      OutboxCommand.prototype,
      'targetTenantId',
      text([
        v.Length(1, 200),
        v.ValidateIf((command: OutboxCommand) => command.targetTenantId !== undefined),
      ]),
    ],
    [OutboxCommand.prototype, 'payload', [v.IsDefined()]],
  ];
  for (const [target, property, rules] of fields) {
    for (const rule of rules) rule(target, property);
  }
}
