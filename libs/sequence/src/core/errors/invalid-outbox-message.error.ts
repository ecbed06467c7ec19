import { SequenceError } from './sequence.error';

/**
 * An event or command does not have the shape its kind requires (or is not JSON). `problems`
 * lists each field that is wrong and why; nothing was recorded.
 */
export class InvalidOutboxMessageError extends SequenceError {
  readonly code = 'invalid-outbox-message' as const;

  constructor(
    readonly kind: 'event' | 'command',
    readonly problems: readonly string[],
    /** The message id, when it had a usable one. */
    readonly id?: string,
  ) {
    super(
      // The id quoted as JSON: whatever it holds (control characters, line breaks) stays on one
      // line of a log and in an x-death-reason header.
      `invalid ${kind}${id ? ` ${JSON.stringify(id)}` : ''}: ${problems.join('; ')}` +
        ` (an event is { id, type, aggregateType, aggregateId, payload, occurredAt, tenantId? };` +
        ` a command is { id, type, targetService, targetTenantId?, payload })`,
    );
  }
}
