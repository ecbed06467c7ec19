import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { callHandler, handOver, type HandlerContext, type HandlerTimeLimit } from './handler-call';

function limitOf(ms: number | undefined, abandoned: Array<Promise<void>> = []): HandlerTimeLimit {
  return {
    ms,
    error: (attempt) => new HandlerTimeoutError('orders', 'event 7', ms ?? 0, attempt),
    abandoned: (settled) => void abandoned.push(settled),
  };
}

describe('callHandler', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('settles as the call does within its limit, with a signal left alone', async () => {
    let seen: HandlerContext | undefined;
    const calling = callHandler(
      async (context) => {
        seen = context;
        await new Promise((resolve) => setTimeout(resolve, 10));
      },
      2,
      limitOf(50),
    );
    await jest.advanceTimersByTimeAsync(10);

    await expect(calling).resolves.toBeUndefined();
    expect(seen).toMatchObject({ attempt: 2 });
    expect(seen?.signal.aborted).toBe(false);
    // Its timer was cleared: nothing fires later.
    expect(jest.getTimerCount()).toBe(0);
  });

  it('fails with the limit error past the limit, aborting the signal with it', async () => {
    const abandoned: Array<Promise<void>> = [];
    let seen: HandlerContext | undefined;
    const calling = callHandler(
      (context) => {
        seen = context;
        return new Promise(() => undefined);
      },
      1,
      limitOf(50, abandoned),
    );
    const outcome = calling.catch((error: unknown) => error);
    await jest.advanceTimersByTimeAsync(50);

    const error = await outcome;
    expect(error).toBeInstanceOf(HandlerTimeoutError);
    expect(error).toMatchObject({
      channel: 'orders',
      subject: 'event 7',
      timeoutMs: 50,
      attempt: 1,
    });
    expect(seen?.signal.aborted).toBe(true);
    expect(seen?.signal.reason).toBe(error);
    expect(abandoned).toHaveLength(1);
  });

  it('abandons a call, with no time limit, once `until` aborts, with its reason', async () => {
    const until = new AbortController();
    const abandoned: Array<Promise<void>> = [];
    let seen: HandlerContext | undefined;
    const calling = callHandler(
      (context) => {
        seen = context;
        return new Promise(() => undefined);
      },
      1,
      { ...limitOf(undefined, abandoned), until: until.signal },
    );
    const outcome = calling.catch((error: unknown) => error);
    await jest.advanceTimersByTimeAsync(1_000);
    expect(seen?.signal.aborted).toBe(false);
    const lost = new Error('the claim was lost');
    until.abort(lost);

    expect(await outcome).toBe(lost);
    expect(seen?.signal.reason).toBe(lost);
    expect(abandoned).toHaveLength(1);
    // Once aborted, no call is made.
    let called = false;
    await expect(
      callHandler(() => void (called = true), 2, { ...limitOf(50), until: until.signal }),
    ).rejects.toBe(lost);
    expect(called).toBe(false);
  });

  it('tells when an abandoned call settles, and observes its late rejection', async () => {
    const abandoned: Array<Promise<void>> = [];
    let fail!: (error: Error) => void;
    const calling = callHandler(
      () => new Promise((_, reject) => (fail = reject)),
      1,
      limitOf(50, abandoned),
    ).catch(() => undefined);
    await jest.advanceTimersByTimeAsync(50);
    await calling;
    let settled = false;
    void abandoned[0].then(() => (settled = true));
    await Promise.resolve();
    expect(settled).toBe(false);

    fail(new Error('late'));

    await expect(abandoned[0]).resolves.toBeUndefined();
    expect(settled).toBe(true);
  });

  it('sets no timer without a limit', async () => {
    let seen: HandlerContext | undefined;
    const calling = callHandler((context) => {
      seen = context;
      return new Promise(() => undefined);
    }, 1);
    await Promise.resolve();

    expect(seen?.signal.aborted).toBe(false);
    expect(jest.getTimerCount()).toBe(0);
    void calling;
  });

  it('runs the work a call handed over after it returned, outside its limit', async () => {
    let sent = false;
    const calling = callHandler(
      (context) =>
        handOver(context, {
          afterCall: async () => {
            await new Promise((resolve) => setTimeout(resolve, 200));
            sent = true;
          },
        }),
      1,
      limitOf(50),
    );
    const outcome = calling.then(
      () => 'done',
      (error: unknown) => error,
    );
    await jest.advanceTimersByTimeAsync(200);

    await expect(outcome).resolves.toBe('done');
    expect(sent).toBe(true);
  });

  it('never runs the work an abandoned call hands over', async () => {
    let finish!: () => void;
    let ran = false;
    const calling = callHandler(
      async (context) => {
        await new Promise<void>((resolve) => (finish = resolve));
        handOver(context, { afterCall: () => Promise.resolve(void (ran = true)) });
      },
      1,
      limitOf(50),
    ).catch((error: unknown) => error);
    await jest.advanceTimersByTimeAsync(50);
    await expect(calling).resolves.toBeInstanceOf(HandlerTimeoutError);

    finish();
    await jest.advanceTimersByTimeAsync(10);
    expect(ran).toBe(false);
  });

  it('tells an abandoned call that its work is dropped, once the call returns', async () => {
    let finish!: () => void;
    const told: string[] = [];
    const calling = callHandler(
      async (context) => {
        await new Promise<void>((resolve) => (finish = resolve));
        handOver(context, {
          afterCall: () => Promise.resolve(void told.push('afterCall')),
          dropped: () => void told.push('dropped'),
        });
      },
      1,
      limitOf(50),
    ).catch((error: unknown) => error);
    await jest.advanceTimersByTimeAsync(50);
    await expect(calling).resolves.toBeInstanceOf(HandlerTimeoutError);
    expect(told).toEqual([]);

    finish();
    await jest.advanceTimersByTimeAsync(10);
    expect(told).toEqual(['dropped']);
  });

  it('drops, rather than runs, the work of a call whose message goes back', async () => {
    const told: string[] = [];
    await callHandler(
      (context) =>
        handOver(context, {
          afterCall: () => Promise.resolve(void told.push('afterCall')),
          dropped: () => void told.push('dropped'),
        }),
      1,
      limitOf(50),
      () => true,
    );
    expect(told).toEqual(['dropped']);
  });
});
