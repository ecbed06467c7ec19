import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';

const run = promisify(execFile);

/**
 * Has the broker refuse every publish to `queue` (a negative confirm, `basic.nack`), through a
 * RabbitMQ policy `max-length: 0, overflow: reject-publish` on that queue alone. A policy rather
 * than queue arguments: the transport declares each queue with its own arguments, and RabbitMQ
 * refuses (406 PRECONDITION_FAILED, "inequivalent arg 'x-max-length'") a declaration that omits
 * an argument the existing queue has, so a queue pre-declared with `x-max-length` would fail the
 * transport's declaration instead of nacking its publishes.
 *
 * Resolves, once the policy is set, with a function that removes it (about a second each way:
 * rabbitmqctl starts an Erlang node).
 */
export async function refuseEveryPublish(queue: string): Promise<() => Promise<void>> {
  const name = `nseq-fault-refuse-${randomUUID()}`;
  const pattern = `^${queue.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`;
  await run('rabbitmqctl', [
    'set_policy',
    '--apply-to',
    'queues',
    '--priority',
    '100',
    name,
    pattern,
    JSON.stringify({ 'max-length': 0, overflow: 'reject-publish' }),
  ]);
  return async () => {
    await run('rabbitmqctl', ['clear_policy', name]);
  };
}
