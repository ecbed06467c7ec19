/**
 * The raw consumer (a) of bench:sequence on NATS JetStream, in the consumer process: the raw
 * stream's durable pull consumer through plain `@nats-io/jetstream` `consume()`, holding at most
 * `prefetch` messages, acking each as it arrives. Nothing else is loaded (no Nest, no module).
 */
import { jetstream } from '@nats-io/jetstream';
import { connectNats } from '../libs/sequence/src/adapters/transports/nats/nats.client';
import { streamName } from '../libs/sequence/src/adapters/transports/nats/nats.naming';

/** The raw path's durable consumer, on its stream of its own. */
export const RAW_NATS_CONSUMER = 'raw';

/** The raw path's stream for `subject`: apart from the module's `NSEQ_…` streams. */
export function rawNatsStream(subject: string): string {
  return streamName('NSEQRAW_', subject);
}

/** Consumes `subject` until stopped, telling `received` each message's byte count. */
export async function startRawNatsConsumer(
  url: string,
  subject: string,
  prefetch: number,
  received: (bytes: number) => void,
): Promise<{ stop(): Promise<void> }> {
  const connection = await connectNats({ servers: url });
  const js = jetstream(connection);
  const consumer = await js.consumers.get(rawNatsStream(subject), RAW_NATS_CONSUMER);
  const messages = await consumer.consume({ max_messages: prefetch });
  const consuming = (async () => {
    for await (const message of messages) {
      message.ack();
      received(message.data.length);
    }
  })();
  return {
    stop: async () => {
      await messages.close();
      await consuming;
      await connection.drain();
    },
  };
}
