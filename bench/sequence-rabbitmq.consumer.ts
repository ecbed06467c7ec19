/**
 * Consumer process of the RabbitMQ benchmark, forked by sequence-rabbitmq.bench.ts (as plain
 * JavaScript, see plain-js-build.ts) so that its peak RSS is the consumer's own. Its only argument
 * is a JSON {@link ConsumerConfig}; it talks to the producer over IPC ({@link ToConsumer},
 * {@link FromConsumer}).
 *
 * - raw (a): plain amqplib, `prefetch`, manual ack; counts bytes until the run's total arrived.
 *   Nothing else is loaded (no Nest, no library), as a plain consumer would be.
 * - module (b): see sequence-rabbitmq.module-consumer.ts, loaded only in that mode.
 */
import * as amqp from 'amqplib';
import { ownCpuSeconds, PeakMemory } from './process-probe';
import type {
  ConsumerConfig,
  FromConsumer,
  ModuleTrace,
  ToConsumer,
} from './sequence-rabbitmq.protocol';

const config = JSON.parse(process.argv[2] ?? '{}') as ConsumerConfig;
const memory = new PeakMemory(config.rssSampleMs);

function send(message: FromConsumer): void {
  process.send?.(message);
}

/** One run: from `arm` to `settled`. */
export class Run {
  private readonly cpuAtStart = ownCpuSeconds();
  received = 0;
  doneSent = false;

  constructor(
    readonly id: string,
    readonly bytes: number,
  ) {
    memory.reset();
  }

  done(bytes: number): void {
    this.doneSent = true;
    send({ type: 'done', run: this.id, bytes });
  }

  settle(trace?: ModuleTrace): void {
    send({
      type: 'settled',
      run: this.id,
      ...memory.read(),
      cpuSeconds: Math.round((ownCpuSeconds() - this.cpuAtStart) * 100) / 100,
      trace,
    });
  }
}

let run: Run | undefined;

interface Consumer {
  /** The prefetch its subscription uses. */
  readonly prefetch: number;
  /** Called when a run is armed, before the producer starts. */
  arm(): void;
  stop(): Promise<void>;
}

async function startRaw(): Promise<Consumer> {
  const connection = await amqp.connect(config.amqpUrl);
  const channel = await connection.createChannel();
  await channel.checkQueue(config.queue);
  await channel.prefetch(config.prefetch);
  await channel.consume(
    config.queue,
    (message) => {
      if (!message) return;
      channel.ack(message);
      const current = run;
      if (!current) throw new Error('a message arrived outside a run');
      current.received += message.content.length;
      if (!current.doneSent && current.received >= current.bytes) {
        current.done(current.received);
        current.settle();
      }
    },
    { noAck: false },
  );
  return {
    prefetch: config.prefetch,
    arm: () => undefined,
    stop: async () => {
      await connection.close();
    },
  };
}

async function main(): Promise<void> {
  // The producer is gone (crashed or killed): nothing left to report to.
  process.on('disconnect', () => process.exit(2));
  const consumer =
    config.mode === 'raw'
      ? await startRaw()
      : await (
          await import('./sequence-rabbitmq.module-consumer')
        ).startModuleConsumer(config, () => run);
  process.on('message', (message: ToConsumer) => {
    if (message.type === 'arm') {
      run = new Run(message.run, message.bytes);
      consumer.arm();
      send({ type: 'armed', run: message.run });
    } else if (message.type === 'stop') {
      memory.stop();
      consumer.stop().then(
        () => process.exit(0),
        (error: unknown) => fail(error),
      );
    }
  });
  send({
    type: 'ready',
    pid: process.pid,
    idleRssMiB: Math.round((process.memoryUsage.rss() / 1024 / 1024) * 10) / 10,
    prefetch: consumer.prefetch,
  });
}

function fail(error: unknown): void {
  const message = error instanceof Error ? (error.stack ?? error.message) : String(error);
  send({ type: 'error', message });
  // Let the IPC message go, then go.
  setTimeout(() => process.exit(1), 100).unref();
}

process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);
main().catch(fail);
