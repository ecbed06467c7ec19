import type { InboundMessage, Subscription, Transport } from 'nest-sequence';

/** Dead letters of one channel, watched until the one looked for arrives. */
export interface DeadLetterWatch {
  /** The dead-letter channel watched. */
  readonly channel: string;
  /** The first dead letter `matches` accepted. */
  readonly arrived: Promise<InboundMessage>;
  close(): Promise<void>;
}

/**
 * Subscribes to `channel`'s dead-letter channel and takes off it the messages `matches` accepts;
 * others (of another run, on a shared broker) go back after a second, for whoever looks for them.
 */
export async function watchDeadLetters(
  transport: Transport,
  channel: string,
  matches: (message: InboundMessage) => boolean,
): Promise<DeadLetterWatch> {
  const deadLetters = transport.deadLetterChannel(channel);
  let found: (message: InboundMessage) => void = () => undefined;
  const arrived = new Promise<InboundMessage>((resolve) => (found = resolve));
  const subscription: Subscription = await transport.subscribe(deadLetters, (message) => {
    if (!matches(message)) {
      return Promise.resolve({ action: 'requeue', delayMs: 1_000, reason: 'not this run’s' });
    }
    found(message);
    return Promise.resolve({ action: 'ack' });
  });
  return { channel: deadLetters, arrived, close: () => subscription.close() };
}
