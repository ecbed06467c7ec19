import { headerText } from './headers';

/**
 * Why the broker dead-lettered a message itself (RabbitMQ: rejected without requeue, expired,
 * over a length or delivery limit), from the `x-first-death-*` headers it adds:
 * `expired: dead-lettered by RabbitMQ from orders`. Undefined for a message it did not
 * dead-letter. Such a message carries no `x-death-reason`: the module did not dead-letter it.
 */
export function brokerDeathReason(headers: Readonly<Record<string, unknown>>): string | undefined {
  const reason = headerText(headers['x-first-death-reason']);
  if (reason === undefined) return undefined;
  const queue = headerText(headers['x-first-death-queue']);
  return `${reason}: dead-lettered by RabbitMQ${queue === undefined ? '' : ` from ${queue}`}`;
}
