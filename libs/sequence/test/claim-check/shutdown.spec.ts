import { bytes, deadLetters } from '../support/sequence-test-app';
import { eventually } from '../support/sequence-test-app';
import { createClaimCheckTestApp, type ClaimCheckTestApp } from './claim-check-test-app';

/**
 * A handler waiting for its next retry when the shutdown's wait ends is not called again: the
 * message goes back to the broker whole, neither dead-lettered nor its payload deleted.
 */
describe('claim check: shutdown while a handler waits to retry', () => {
  let t: ClaimCheckTestApp;

  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      claimCheck: { inlineMaxBytes: 1_024 },
      handlers: [
        {
          channel: 'cc.test',
          handlerRetry: { attempts: 3, baseDelayMs: 1_000, maxDelayMs: 1_000 },
        },
      ],
      module: { shutdownTimeoutMs: 100 },
    });
    t.handler.failNext = 10;
  });

  it.each([
    ['an inline payload', 512],
    ['a payload behind a ticket', 64 * 1024],
  ])('hands %s back without calling the handler again', async (_what, size) => {
    await t.claimCheck.publish(t.channel, bytes(size, 3));
    await eventually(() => t.handler.calls === 1, 'the first attempt failed');

    await t.close(); // the retry waits 500-1,000 ms; the drain gives up after 100
    await new Promise((resolve) => setTimeout(resolve, 1_200));

    expect(t.handler.calls).toBe(1);
    expect(deadLetters(t.transport, t.channel)).toHaveLength(0);
    expect(t.transport.depth(t.channel)).toBe(1);
  });
});
