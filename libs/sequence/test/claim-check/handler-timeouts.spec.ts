import { HandlerTimeoutError, type HandlerContext } from 'nest-sequence';
import type { HeaderMap } from 'nest-sequence/wire';
import { eventually } from '../support/sequence-test-app';
import { createClaimCheckTestApp, type ClaimCheckTestApp } from './claim-check-test-app';

// Long enough that the handler's successful call at the end (a claim read and a return) does not
// run past it when a full suite's garbage collection stalls the process.
const TIMEOUT_MS = 200;
const CHANNEL = 'cc.timeouts';

describe('claim check: a handler that runs past handlerTimeoutMs', () => {
  let t: ClaimCheckTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('is retried, then the ticket is dead-lettered handler-timeout and its claim let go', async () => {
    t = await createClaimCheckTestApp({
      handlers: [
        {
          channel: CHANNEL,
          handlerTimeoutMs: TIMEOUT_MS,
          handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 },
        },
      ],
      claimCheck: { inlineMaxBytes: 10 },
    });
    const contexts: HandlerContext[] = [];
    let stuck = true;
    t.handler.onCall = (_payload, context) => {
      contexts.push(context);
      return stuck ? new Promise<void>(() => undefined) : Promise.resolve();
    };
    const payload = Buffer.from('a payload behind a ticket');
    await t.claimCheck.publish(CHANNEL, payload);
    await t.transport.whenIdle();

    expect(contexts.map((context) => context.attempt)).toEqual([1, 2]);
    expect(contexts.every((context) => context.signal.reason instanceof HandlerTimeoutError)).toBe(
      true,
    );
    const dead = t.transport.peek(`${CHANNEL}.dlq`);
    expect(dead).toHaveLength(1);
    expect(String(dead[0].headers['x-death-reason'])).toMatch(
      new RegExp(
        `^handler-timeout: ticket [^:]+:[^:]+: handler timed out after ${TIMEOUT_MS} ms ` +
          '\\(handlerTimeoutMs\\) on its last call, after 2 call\\(s\\) failed$',
      ),
    );

    // The ticket's claim was released: published again, it is handled at once, not found busy.
    stuck = false;
    await t.transport.publish(CHANNEL, dead[0].body, dead[0].headers as HeaderMap);
    await eventually(() => t!.handler.deliveries.length === 1, 'the ticket to be handled');
    await t.transport.whenIdle();
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(t.transport.actionsOn(CHANNEL)).toEqual(['dead-letter', 'ack']);
  });
});
