import { IntervalJob } from './interval-job';

describe('IntervalJob', () => {
  it('says it is stopping once stop() was called, so that long work can end between steps', async () => {
    let steps = 0;
    // Steps until told to stop: without `stopping`, it would never end (and the test time out).
    const job: IntervalJob<number> = new IntervalJob('test:steps', undefined, async () => {
      while (!job.stopping) {
        steps++;
        await new Promise((resolve) => setImmediate(resolve));
      }
      return steps;
    });
    const running = job.run();
    await new Promise((resolve) => setTimeout(resolve, 5));

    await expect(job.stop()).resolves.toBe(true);
    expect(await running).toBeGreaterThan(0);
  });

  it('gives up waiting for a run that never settles after maxWaitMs, saying so', async () => {
    const job = new IntervalJob('test:hung', undefined, () => new Promise<never>(() => undefined));
    void job.run();
    const started = Date.now();

    await expect(job.stop(50)).resolves.toBe(false);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it('resolves true at once when nothing runs', async () => {
    const job = new IntervalJob('test:idle', undefined, async () => 1);
    await expect(job.stop(50)).resolves.toBe(true);
  });
});
