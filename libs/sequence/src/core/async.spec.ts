import {
  delay,
  MAX_TIMER_MS,
  oneAtATime,
  retryWithin,
  settlesWithin,
  unlessAborted,
  withTimeout,
} from './async';

describe('delay', () => {
  it('resolves after the given time, not before', async () => {
    const startedAt = performance.now();
    await delay(30);
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(25);
  });
});

describe('withTimeout', () => {
  const timedOut = () => new Error('timed out (expected by the test)');

  it('settles as the promise does when it settles in time', async () => {
    await expect(withTimeout(Promise.resolve(7), 1_000, timedOut)).resolves.toBe(7);
    const failure = new Error('failed (expected by the test)');
    await expect(withTimeout(Promise.reject(failure), 1_000, timedOut)).rejects.toBe(failure);
  });

  it('rejects with onTimeout() when the promise is too slow', async () => {
    const startedAt = performance.now();
    const never = new Promise<number>(() => undefined);
    await expect(withTimeout(never, 30, timedOut)).rejects.toThrow('timed out');
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(25);
  });

  it('treats a deadline already past as an immediate timeout', async () => {
    const never = new Promise<number>(() => undefined);
    await expect(withTimeout(never, -5, timedOut)).rejects.toThrow('timed out');
  });

  it('observes a promise that rejects after the timeout, so nothing is left unhandled', async () => {
    const unhandled = jest.fn();
    process.on('unhandledRejection', unhandled);
    try {
      const late = delay(20).then(() => Promise.reject(new Error('late (expected by the test)')));
      await expect(withTimeout(late, 5, timedOut)).rejects.toThrow('timed out');
      await delay(40);
      expect(unhandled).not.toHaveBeenCalled();
    } finally {
      process.off('unhandledRejection', unhandled);
    }
  });
});

describe('settlesWithin', () => {
  it('says true for a promise that resolves or rejects in time, false for one still running', async () => {
    await expect(settlesWithin(Promise.resolve(1), 50)).resolves.toBe(true);
    await expect(settlesWithin(Promise.reject(new Error('failed')), 50)).resolves.toBe(true);
    const started = Date.now();
    await expect(settlesWithin(new Promise(() => undefined), 50)).resolves.toBe(false);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it('waits at most MAX_TIMER_MS, rather than a longer delay that Node would fire at once', async () => {
    let settle!: () => void;
    const running = new Promise<void>((resolve) => (settle = resolve));
    const verdict = settlesWithin(running, MAX_TIMER_MS + 1_000);
    await new Promise((resolve) => setTimeout(resolve, 20));
    settle();
    await expect(verdict).resolves.toBe(true);
  });
});

describe('oneAtATime', () => {
  it('shares the pending call, and calls again once it has settled (resolved or rejected)', async () => {
    const calls: Array<(value: number) => void> = [];
    let failNext = false;
    const read = oneAtATime(
      () =>
        new Promise<number>((resolve, reject) => {
          if (failNext) reject(new Error('down'));
          else calls.push(resolve);
        }),
    );

    const first = read();
    expect(read()).toBe(first);
    expect(calls).toHaveLength(1);
    calls[0](7);
    await expect(first).resolves.toBe(7);

    failNext = true;
    await expect(read()).rejects.toThrow('down');
    failNext = false;
    void read();
    expect(calls).toHaveLength(2);
  });

  it('turns a call that throws before returning a promise into a rejection, and calls again', async () => {
    let throws = true;
    const read = oneAtATime((): Promise<number> => {
      if (throws) throw new Error('client is closed');
      return Promise.resolve(1);
    });

    await expect(read()).rejects.toThrow('client is closed');
    throws = false;
    await expect(read()).resolves.toBe(1);
  });
});

describe('unlessAborted', () => {
  it("settles as the promise does, or rejects with the signal's reason once it aborts", async () => {
    await expect(unlessAborted(Promise.resolve(1), undefined)).resolves.toBe(1);
    await expect(unlessAborted(Promise.resolve(2), new AbortController().signal)).resolves.toBe(2);

    const controller = new AbortController();
    const waiting = unlessAborted(new Promise<never>(() => undefined), controller.signal);
    controller.abort(new Error('the handler is over'));
    await expect(waiting).rejects.toThrow('the handler is over');

    await expect(unlessAborted(Promise.resolve(3), controller.signal)).rejects.toThrow(
      'the handler is over',
    );
  });
});

describe('retryWithin', () => {
  const failing = (times: number) => {
    let calls = 0;
    const attempt = jest.fn(async () => {
      if (++calls <= times) throw new Error(`failure ${calls}`);
      return 'done';
    });
    return attempt;
  };

  it('calls again after each failure until one resolves, within the time', async () => {
    const attempt = failing(2);
    const waits: number[] = [];
    await expect(
      retryWithin(attempt, 5_000, { onRetry: (_error, waitMs) => waits.push(waitMs) }),
    ).resolves.toBe('done');
    expect(attempt).toHaveBeenCalledTimes(3);
    expect(waits).toEqual([50, 100]);
  });

  it('rethrows the last error once the next wait would end past the time', async () => {
    await expect(retryWithin(failing(100), 120)).rejects.toThrow('failure 2');
  });

  it('ends a wait at once when the signal aborts, rethrowing the last error', async () => {
    const controller = new AbortController();
    const attempt = failing(100);
    let abortedAt = 0;
    const retried = retryWithin(attempt, 60_000, {
      signal: controller.signal,
      onRetry: (_error, waitMs) => {
        if (waitMs < 1_600) return;
        abortedAt = Date.now();
        controller.abort(); // as the 1.6 s wait begins
      },
    });
    await expect(retried).rejects.toThrow('failure 6');
    expect(Date.now() - abortedAt).toBeLessThan(500);
    expect(attempt).toHaveBeenCalledTimes(6);
  });
});
