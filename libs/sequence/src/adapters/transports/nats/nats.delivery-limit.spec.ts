import type { Logger } from '@nestjs/common';
import type { StoredMsg } from '@nats-io/jetstream';
import type { NatsConnection } from './nats.client';
import { NatsDeliveryLimitWatch, type NatsDeliveryLimitSettings } from './nats.delivery-limit';

/**
 * The watch's retries against the dead-letter stream's duplicate window, with the server's parts
 * stubbed: what is under test is when the watch publishes, not the server (nats.transport.spec.ts
 * moves max-deliver dead letters on a real one).
 */
describe('NatsDeliveryLimitWatch retries', () => {
  const PUBLISH_TIMEOUT_MS = 30_000;
  const WINDOW_MS = 60_000;

  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  function watchWith(publish: NatsDeliveryLimitSettings['publish']) {
    let advisory: ((error: Error | null, message: unknown) => void) | undefined;
    const connection = {
      subscribe: (_subject: string, options: { callback: typeof advisory }) => {
        advisory = options.callback;
        return { unsubscribe: () => undefined };
      },
    } as unknown as NatsConnection;
    const errors: string[] = [];
    const stored = {
      seq: 7,
      time: new Date(0),
      header: undefined,
      data: Buffer.from('body'),
    } as unknown as StoredMsg;
    const watch = new NatsDeliveryLimitWatch({
      channel: 'orders',
      stream: 'ORDERS',
      consumer: 'orders',
      deadLetterChannel: 'orders.dlq',
      connection,
      read: () => Promise.resolve(stored),
      publish,
      remove: () => Promise.resolve(true),
      deadLettered: () => undefined,
      logger: { error: (message: string) => errors.push(message) } as unknown as Logger,
      publishTimeoutMs: PUBLISH_TIMEOUT_MS,
      duplicateWindowMs: () => WINDOW_MS,
    });
    watch.start();
    const giveUp = () =>
      advisory!(null, {
        json: () => ({
          stream: 'ORDERS',
          consumer: 'orders',
          stream_seq: stored.seq,
          deliveries: 2,
        }),
      });
    return { watch, errors, giveUp };
  }

  it('publishes no retry that could reach the server after the duplicate window', async () => {
    const started: number[] = [];
    // Each try times out: its dead letter may have been stored without a confirm.
    const publish = jest.fn(() => {
      started.push(Date.now());
      return new Promise<never>((_, reject) =>
        setTimeout(() => reject(new Error('publish timed out')), PUBLISH_TIMEOUT_MS),
      );
    });
    const { watch, errors, giveUp } = watchWith(publish);
    const first = Date.now();
    giveUp();
    await jest.advanceTimersByTimeAsync(10 * (PUBLISH_TIMEOUT_MS + 1_000));
    await watch.stop();

    expect(started.length).toBeGreaterThan(0);
    for (const at of started) {
      expect(at + PUBLISH_TIMEOUT_MS).toBeLessThanOrEqual(first + WINDOW_MS);
    }
    expect(errors).toEqual([
      expect.stringMatching(
        /message 7 of orders reached its max_deliver and could not be dead-lettered[\s\S]*duplicate window \(60000 ms\)[\s\S]*look in orders\.dlq first/,
      ),
    ]);
  });

  it('retries within the window as before', async () => {
    let tries = 0;
    const publish = jest.fn(() => {
      tries += 1;
      return tries < 3
        ? Promise.reject(new Error('no responders'))
        : Promise.resolve({ duplicate: false });
    });
    const { watch, errors, giveUp } = watchWith(publish);
    giveUp();
    await jest.advanceTimersByTimeAsync(5_000);
    await watch.stop();
    expect(publish).toHaveBeenCalledTimes(3);
    expect(errors).toEqual([]);
  });
});
