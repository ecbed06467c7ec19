/**
 * Consumer process of the RabbitMQ benchmark, forked by sequence-rabbitmq.bench.ts (as plain
 * JavaScript, see harness/plain-js-build.ts) so that its peak RSS is the consumer's own. Its only
 * argument is a JSON {@link ConsumerConfig}; it talks to the producer over IPC ({@link ToConsumer},
 * {@link FromConsumer}, harness/child-main.ts).
 *
 * - raw (a): plain amqplib, `prefetch`, manual ack (on NATS: sequence-nats.raw-consumer.ts);
 *   counts bytes until the run's total arrived. Nothing else is loaded (no Nest, no library), as
 *   a plain consumer would be.
 * - module (b): see sequence-rabbitmq.module-consumer.ts, loaded only in that mode.
 */
import * as amqp from 'amqplib';
import { childConfig, runChild, type ParentLink } from './harness/child-main';
import { ownCpuSeconds } from './harness/cpu';
import { PeakMemory } from './harness/measure';
import type {
  ConsumerConfig,
  FromConsumer,
  ModuleTrace,
  ToConsumer,
} from './sequence-rabbitmq.protocol';

const config = childConfig<ConsumerConfig>();
const memory = new PeakMemory(config.rssSampleMs);

/** One run: from `arm` to `settled`. */
export class Run {
  private readonly cpuAtStart = ownCpuSeconds();
  received = 0;
  doneSent = false;

  constructor(
    private readonly parent: ParentLink<FromConsumer>,
    readonly id: string,
    readonly bytes: number,
  ) {
    memory.reset();
  }

  done(bytes: number): void {
    this.doneSent = true;
    this.parent.send({ type: 'done', run: this.id, bytes });
  }

  settle(trace?: ModuleTrace): void {
    this.parent.send({
      type: 'settled',
      run: this.id,
      ...memory.read(),
      cpuSeconds: Math.round((ownCpuSeconds() - this.cpuAtStart) * 100) / 100,
      trace,
    });
  }
}

let run: Run | undefined;

/** What either consumer gives: the prefetch its subscription uses, and how to close it. */
export interface Consumer {
  readonly prefetch: number;
  /** Called when a run is armed, before the producer starts. */
  arm(): void;
  stop(): Promise<void>;
}

/** A raw consumer took `bytes`: the run is done once its total arrived. */
function receivedRaw(bytes: number): void {
  const current = run;
  if (!current) throw new Error('a message arrived outside a run');
  current.received += bytes;
  if (!current.doneSent && current.received >= current.bytes) {
    current.done(current.received);
    current.settle();
  }
}

async function startRaw(): Promise<Consumer> {
  if (config.transport === 'nats') {
    const { startRawNatsConsumer } = await import('./sequence-nats.raw-consumer');
    const nats = await startRawNatsConsumer(config.url, config.queue, config.prefetch, receivedRaw);
    return { prefetch: config.prefetch, arm: () => undefined, stop: () => nats.stop() };
  }
  const connection = await amqp.connect(config.url);
  const channel = await connection.createChannel();
  await channel.checkQueue(config.queue);
  await channel.prefetch(config.prefetch);
  await channel.consume(
    config.queue,
    (message) => {
      if (!message) return;
      channel.ack(message);
      receivedRaw(message.content.length);
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

runChild<ToConsumer, FromConsumer>(async (parent) => {
  const consumer =
    config.mode === 'raw'
      ? await startRaw()
      : await (
          await import('./sequence-rabbitmq.module-consumer')
        ).startModuleConsumer(config, () => run);
  return {
    ready: { prefetch: consumer.prefetch },
    handle(message) {
      run = new Run(parent, message.run, message.bytes);
      consumer.arm();
      parent.send({ type: 'armed', run: message.run });
    },
    async stop() {
      memory.stop();
      await consumer.stop();
    },
  };
});
