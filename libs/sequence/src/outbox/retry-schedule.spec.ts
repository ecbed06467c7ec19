import { describeError, failedAttempt, retryDelay } from './retry-schedule';

const retry = { attempts: 4, baseDelayMs: 1_000, maxDelayMs: 60_000 };
const options = { retry };

describe('retry schedule', () => {
  it('doubles per attempt, between half and all of the ceiling, up to maxDelayMs', () => {
    expect(retryDelay(1, retry, () => 0)).toBe(500);
    expect(retryDelay(1, retry, () => 1)).toBe(1_000);
    expect(retryDelay(3, retry, () => 0)).toBe(2_000);
    expect(retryDelay(3, retry, () => 1)).toBe(4_000);
    expect(retryDelay(30, retry, () => 1)).toBe(60_000);
    expect(retryDelay(1_000, retry, () => 0.5)).toBe(45_000);
  });

  it('retries until retry.attempts, then fails, keeping the error', () => {
    const error = new Error('broker said no');
    expect(failedAttempt({ id: 'a', attempts: 0 }, error, 10_000, options)).toMatchObject({
      status: 'retry',
      error: 'Error: broker said no',
    });
    const retry = failedAttempt({ id: 'a', attempts: 2 }, error, 10_000, options);
    expect(retry.status === 'retry' && retry.nextAttemptAt).toBeGreaterThanOrEqual(12_000);
    expect(failedAttempt({ id: 'a', attempts: 3 }, error, 0, options)).toEqual({
      id: 'a',
      status: 'failed',
      error: 'Error: broker said no',
    });
    expect(failedAttempt({ id: 'a', attempts: 0 }, 'plain', 0, options, true)).toEqual({
      id: 'a',
      status: 'failed',
      error: 'thrown: plain',
    });
  });
});

describe('describeError', () => {
  it('drops NUL characters (PostgreSQL text cannot hold them) and caps the length', () => {
    expect(describeError(new Error('a\u0000b'))).toBe('Error: ab');
    expect(describeError(new Error('x'.repeat(5_000)))).toHaveLength(2_000);
  });
});
