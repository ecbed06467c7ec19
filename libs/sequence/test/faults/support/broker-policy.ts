import { randomUUID } from 'node:crypto';
import { rabbitmqctl, rabbitmqctlRows } from '../../support/processes/rabbitmqctl';

/**
 * Has the broker refuse every publish to `queue` (a negative confirm, `basic.nack`), through a
 * RabbitMQ policy `max-length: 0, overflow: reject-publish` on that queue alone. A policy rather
 * than queue arguments: the transport declares each queue with its own arguments, and RabbitMQ
 * refuses (406 PRECONDITION_FAILED, "inequivalent arg 'x-max-length'") a declaration that omits
 * an argument the existing queue has, so a queue pre-declared with `x-max-length` would fail the
 * transport's declaration instead of nacking its publishes.
 *
 * Resolves, once the policy is in effect on the queue (if it exists yet; a queue declared later
 * gets it at its declaration), with a function that removes it and resolves once the queue no
 * longer has it: the broker applies policy changes to existing queues asynchronously. About a
 * second per rabbitmqctl call (each starts an Erlang node).
 */
export async function refuseEveryPublish(queue: string): Promise<() => Promise<void>> {
  const name = `nseq-fault-refuse-${randomUUID()}`;
  const pattern = `^${queue.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`;
  await rabbitmqctl([
    'set_policy',
    '--apply-to',
    'queues',
    '--priority',
    '100',
    name,
    pattern,
    JSON.stringify({ 'max-length': 0, overflow: 'reject-publish' }),
  ]);
  await waitForQueuePolicy(queue, (policy) => policy === undefined || policy === name);
  return async () => {
    await rabbitmqctl(['clear_policy', name]);
    await waitForQueuePolicy(queue, (policy) => policy !== name);
  };
}

/**
 * Polls the policy RabbitMQ reports for `queue` (undefined: no such queue; '' none) until `done`
 * accepts it; fails after `timeoutMs`. The broker applies policy changes to existing queues
 * asynchronously.
 */
export async function waitForQueuePolicy(
  queue: string,
  done: (policy: string | undefined) => boolean,
  timeoutMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rows = await rabbitmqctlRows('list_queues', ['name', 'policy']);
    const row = rows.find(([listed]) => listed === queue);
    if (done(row ? (row[1] ?? '') : undefined)) return;
    if (Date.now() > deadline) {
      throw new Error(`the policy of ${queue} did not settle in ${timeoutMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
