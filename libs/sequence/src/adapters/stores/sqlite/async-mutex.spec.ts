import { setTimeout as sleep } from 'node:timers/promises';
import { AsyncMutex } from './async-mutex';

describe('AsyncMutex', () => {
  it('lets one holder in at a time', async () => {
    const mutex = new AsyncMutex();
    let inside = 0;
    let most = 0;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        const release = await mutex.acquire();
        inside += 1;
        most = Math.max(most, inside);
        await sleep(2);
        inside -= 1;
        release();
      }),
    );
    expect(most).toBe(1);
    expect(mutex.isLocked).toBe(false);
  });

  it('hands the lock out in the order it was asked for', async () => {
    const mutex = new AsyncMutex();
    const first = await mutex.acquire();
    const order: number[] = [];
    const waiters = [1, 2, 3].map(async (n) => {
      const release = await mutex.acquire();
      order.push(n);
      release();
    });
    first();
    await Promise.all(waiters);
    expect(order).toEqual([1, 2, 3]);
  });

  it('does not let a caller that arrives at release time jump the queue', async () => {
    const mutex = new AsyncMutex();
    const first = await mutex.acquire();
    const order: string[] = [];
    const queued = mutex.acquire().then((release) => {
      order.push('queued');
      release();
    });
    first();
    const late = mutex.acquire().then((release) => {
      order.push('late');
      release();
    });
    await Promise.all([queued, late]);
    expect(order).toEqual(['queued', 'late']);
  });

  it('ignores a second release of the same hold', async () => {
    const mutex = new AsyncMutex();
    const release = await mutex.acquire();
    release();
    const second = await mutex.acquire();
    release();
    expect(mutex.isLocked).toBe(true);
    second();
    expect(mutex.isLocked).toBe(false);
  });
});
