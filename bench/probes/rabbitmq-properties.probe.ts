/**
 * What a message's AMQP properties cost RabbitMQ per publish: the same 60-byte persistent
 * messages, 64 unconfirmed at a time on a confirm channel, with the properties of each mode:
 *
 * - `headers`: the two headers of `bench:resequencer`'s messages (`x-resequence-key`, `-seq`);
 * - `headers+message-id`: the same and a random `messageId`, as `RabbitMqTransport` gives each
 *   publish;
 * - `headers+transport`: the same, also `mandatory`, as `RabbitMqTransport` publishes;
 * - `headers+pad-<n>`: the two headers and a third header of n characters.
 *
 * It reads RabbitMQ's CPU (its busiest `beam.smp` process) around each batch of `PROBE_MESSAGES`
 * (20,000) and runs the modes in turn, `PROBE_ROUNDS` (6) rounds, all in one process (what it
 * measures is the broker's CPU, not its own):
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/rabbitmq-properties.probe.ts headers headers+message-id headers+pad-4 …
 *
 * Prints one JSON line per mode (`case`: the mode) with the median and every round's CPU ms per
 * 1,000 publishes; its queues (`nseq-probe-properties-<run>-*`) are removed at the end, also on
 * failure or Ctrl-C. docs/benchmarks.md (Resequencer) cites it.
 */
import { randomUUID } from 'node:crypto';
import type * as amqp from 'amqplib';
import { onCleanup, runBench } from '../harness/cleanup';
import { CpuMeter, msPerThousand } from '../harness/cpu';
import { median, report } from '../harness/report';
import { connectAmqp, newRunId, QueueJanitor } from '../harness/resources';
import { servers } from '../harness/settings';

const MESSAGES = Number(process.env.PROBE_MESSAGES || 20_000);
const ROUNDS = Number(process.env.PROBE_ROUNDS || 6);
const IN_FLIGHT = 64;
const KEYS = 1_000;
const body = Buffer.alloc(60, 120);

/** The publish options of message `i` in `mode`; throws on a mode it does not know. */
function optionsOf(mode: string, i: number): amqp.Options.Publish {
  const headers: Record<string, unknown> = {
    'x-resequence-key': `k${i % KEYS}`,
    'x-resequence-seq': i,
  };
  const options: amqp.Options.Publish = { persistent: true, headers };
  if (mode === 'headers') return options;
  if (mode === 'headers+message-id') return { ...options, messageId: randomUUID() };
  if (mode === 'headers+transport') {
    return { ...options, messageId: randomUUID(), mandatory: true };
  }
  const pad = /^headers\+pad-(\d+)$/.exec(mode);
  if (pad) return { ...options, headers: { ...headers, p: 'x'.repeat(Number(pad[1])) } };
  throw new Error(`unknown mode ${mode}`);
}

/** Publishes MESSAGES to a fresh queue; RabbitMQ's CPU ms per 1,000 and the rate. */
async function publishAll(
  channel: amqp.ConfirmChannel,
  queue: string,
  mode: string,
  cpu: CpuMeter,
): Promise<{ rabbitmqMsPerThousand?: number; messagesPerSecond: number }> {
  await channel.assertQueue(queue, { durable: true });
  const before = cpu.read();
  let next = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      for (let i = next++; i < MESSAGES; i = next++) {
        await new Promise<void>((resolve, reject) =>
          channel.publish('', queue, body, optionsOf(mode, i), (error: Error | null) =>
            error ? reject(error) : resolve(),
          ),
        );
      }
    }),
  );
  const spent = CpuMeter.spent(before, cpu.read());
  await channel.deleteQueue(queue);
  return {
    rabbitmqMsPerThousand: msPerThousand(spent.servers.rabbitmq, MESSAGES),
    messagesPerSecond: Math.round(MESSAGES / spent.wallSeconds),
  };
}

async function main(): Promise<void> {
  const modes = process.argv.slice(2);
  if (modes.length === 0) throw new Error('usage: … <mode> [<mode> …] (see the file header)');
  for (const mode of modes) optionsOf(mode, 0);
  const url = servers.amqpUrl;
  const prefix = `nseq-probe-properties-${newRunId()}`;
  const janitor = new QueueJanitor(url, `${prefix}-*`);
  const connection = await connectAmqp(url);
  onCleanup('close the connection', () => connection.close());
  const channel = await connection.createConfirmChannel();
  const cpu = new CpuMeter(['rabbitmq']);
  const figures = new Map(modes.map((mode) => [mode, [] as number[]]));
  const rates = new Map(modes.map((mode) => [mode, [] as number[]]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const [index, mode] of modes.entries()) {
      const queue = janitor.track(`${prefix}-${round}-${index}`);
      const result = await publishAll(channel, queue, mode, cpu);
      if (result.rabbitmqMsPerThousand !== undefined) {
        figures.get(mode)!.push(result.rabbitmqMsPerThousand);
      }
      rates.get(mode)!.push(result.messagesPerSecond);
    }
  }
  for (const mode of modes) {
    const perRound = figures.get(mode)!;
    report(
      { bench: 'rabbitmq-properties', case: mode, variant: 'default', ratio: null },
      {
        rabbitmqMsPerThousand: perRound.length > 0 ? median(perRound) : null,
        rabbitmqMsPerThousandPerRound: perRound,
        messagesPerSecond: median(rates.get(mode)!),
      },
    );
  }
}

runBench('rabbitmq-properties', main);
