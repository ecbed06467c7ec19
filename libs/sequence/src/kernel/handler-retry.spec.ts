import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { handOver } from './handler-call';
import { callHandlerWithRetry } from './handler-retry';

const policy = { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 };
const limit = {
  ms: 20,
  error: (attempt: number) => new HandlerTimeoutError('orders', 'event 7', 20, attempt),
};

describe('callHandlerWithRetry', () => {
  it('awaits the give-up work of the call the retries end on, before it answers', async () => {
    const given: Array<{ call: number; attempts: number; error: unknown }> = [];
    let calls = 0;
    const outcome = await callHandlerWithRetry(
      (context) => {
        const call = ++calls;
        handOver(context, {
          onGiveUp: async ({ attempts, error }) => {
            await new Promise((resolve) => setTimeout(resolve, 10));
            given.push({ call, attempts, error });
          },
        });
        return new Promise(() => undefined); // never settles
      },
      policy,
      { limit, onFailure: () => undefined, isFinal: () => false },
    );

    expect(outcome).toMatchObject({ ok: false, attempts: 2 });
    expect(given).toEqual([
      { call: 2, attempts: 2, error: outcome.ok ? undefined : outcome.error },
    ]);
    expect(given[0].error).toBeInstanceOf(HandlerTimeoutError);
  });

  it('ends at a call abandoned as limit.until aborts: no failure counted, no give-up work', async () => {
    const lost = new AbortController();
    const reason = new Error('the lease is lost');
    const failures: unknown[] = [];
    let calls = 0;
    let gaveUp = false;
    const answer = callHandlerWithRetry(
      (context) => {
        calls++;
        handOver(context, { onGiveUp: async () => void (gaveUp = true) });
        return new Promise(() => undefined); // works on, heedless of its signal
      },
      { attempts: 3, baseDelayMs: 1, maxDelayMs: 1 },
      {
        limit: { ...limit, ms: 60_000, until: lost.signal },
        onFailure: (error) => void failures.push(error),
        isFinal: () => false,
      },
    );
    await new Promise((resolve) => setTimeout(resolve, 10));
    lost.abort(reason);
    const outcome = await answer;

    expect(outcome).toMatchObject({ ok: false, attempts: 1, error: reason });
    expect({ calls, gaveUp, failures }).toEqual({ calls: 1, gaveUp: false, failures: [] });
  });

  it('ends a retry waiting for its backoff once stop aborts, without give-up work', async () => {
    const stop = new AbortController();
    let calls = 0;
    let gaveUp = false;
    const answer = callHandlerWithRetry(
      (context) => {
        calls++;
        handOver(context, { onGiveUp: async () => void (gaveUp = true) });
        throw new Error('downstream unavailable');
      },
      { attempts: 3, baseDelayMs: 60_000, maxDelayMs: 60_000 },
      { onFailure: () => undefined, isFinal: () => false, stop: stop.signal },
    );
    await new Promise((resolve) => setTimeout(resolve, 20));
    stop.abort();
    const outcome = await answer;

    expect(outcome).toMatchObject({ ok: false, attempts: 1, stopped: true });
    expect({ calls, gaveUp }).toEqual({ calls: 1, gaveUp: false });
  });

  it('makes no call at all once stop has aborted', async () => {
    const stop = new AbortController();
    stop.abort();
    let calls = 0;
    const outcome = await callHandlerWithRetry(
      () => void calls++,
      { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
      { onFailure: () => undefined, isFinal: () => false, stop: stop.signal },
    );
    expect(outcome).toMatchObject({ ok: false, attempts: 0, stopped: true });
    expect(calls).toBe(0);
  });

  it('makes no call once stop aborted while it waited before the call', async () => {
    const stop = new AbortController();
    let calls = 0;
    let release!: () => void;
    const abandonedReturns = new Promise<void>((resolve) => (release = resolve));
    let waits = 0;
    const answer = callHandlerWithRetry(
      () => {
        calls++;
        throw new Error('downstream unavailable');
      },
      { attempts: 3, baseDelayMs: 0, maxDelayMs: 0 },
      {
        onFailure: () => undefined,
        isFinal: () => false,
        stop: stop.signal,
        // The retry waits for an abandoned call of its key to return (the resequencer's).
        beforeCall: () => (waits++ === 0 ? Promise.resolve() : abandonedReturns),
      },
    );
    await new Promise((resolve) => setTimeout(resolve, 20));
    stop.abort(new Error('shutting down'));
    release();

    expect(await answer).toMatchObject({ ok: false, attempts: 1, stopped: true });
    expect(calls).toBe(1);
  });

  it('does not run the give-up work of a call that a later one made good', async () => {
    let gaveUp = false;
    let calls = 0;
    const outcome = await callHandlerWithRetry(
      (context) => {
        handOver(context, { onGiveUp: () => Promise.resolve(void (gaveUp = true)) });
        if (++calls === 1) throw new Error('store away');
      },
      policy,
      { limit, onFailure: () => undefined, isFinal: () => false },
    );

    expect(outcome).toEqual({ ok: true, attempts: 2 });
    expect(gaveUp).toBe(false);
  });

  it('runs no handed-over work of a call whose message the consumer hands back', async () => {
    const ran: string[] = [];
    const work = (context: Parameters<typeof handOver>[0]) =>
      handOver(context, {
        afterCall: () => Promise.resolve(void ran.push('afterCall')),
        onGiveUp: () => Promise.resolve(void ran.push('onGiveUp')),
      });
    let readFailed = false;
    const hooks = {
      limit,
      onFailure: () => undefined,
      isFinal: () => readFailed,
      handsBack: () => readFailed,
    };

    // A call that returns in time after its read failed, then one that runs past its limit.
    readFailed = true;
    const returned = await callHandlerWithRetry((context) => work(context), policy, hooks);
    const abandoned = await callHandlerWithRetry(
      (context) => {
        work(context);
        return new Promise(() => undefined); // never settles
      },
      policy,
      hooks,
    );
    expect(returned).toEqual({ ok: true, attempts: 1 });
    expect(abandoned).toMatchObject({ ok: false, attempts: 1 });
    expect(ran).toEqual([]);

    // The same calls, handed back by none: the work runs.
    readFailed = false;
    await callHandlerWithRetry((context) => work(context), policy, hooks);
    await callHandlerWithRetry(
      (context) => {
        work(context);
        return new Promise(() => undefined);
      },
      policy,
      hooks,
    );
    expect(ran).toEqual(['afterCall', 'onGiveUp']);
  });
});
