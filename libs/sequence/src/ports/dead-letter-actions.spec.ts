import {
  actOnEach,
  ChannelLocks,
  OccurrenceIds,
  Pacer,
  reasonMatches,
  replayHeaders,
} from './dead-letter-actions';

describe('dead-letter actions', () => {
  describe('Pacer', () => {
    it('lets the first call through at once and spaces the next ones by 1/ratePerSecond', async () => {
      let now = 1_000;
      const waits: number[] = [];
      const pacer = new Pacer(
        4,
        () => now,
        async (ms) => {
          waits.push(ms);
          now += ms;
        },
      );

      for (let i = 0; i < 4; i++) await pacer.next();

      expect(waits).toEqual([250, 250, 250]);
    });

    it('does not wait when the caller was slower than the rate', async () => {
      let now = 0;
      const waits: number[] = [];
      const pacer = new Pacer(
        10,
        () => now,
        async (ms) => void waits.push(ms),
      );

      await pacer.next();
      now += 500;
      await pacer.next();

      expect(waits).toEqual([]);
    });

    it.each([0, -1, Number.NaN, Infinity])('refuses ratePerSecond %p', (rate) => {
      expect(() => new Pacer(rate)).toThrow(RangeError);
    });
  });

  it('matches a reason by its whole text or by its code', () => {
    expect(reasonMatches('integrity-mismatch: crc', 'integrity-mismatch')).toBe(true);
    expect(reasonMatches('integrity-mismatch: crc', 'integrity-mismatch: crc')).toBe(true);
    expect(reasonMatches('integrity-mismatch: crc', 'integrity')).toBe(false);
    expect(reasonMatches('anything', undefined)).toBe(true);
    expect(reasonMatches('expired ', 'expired')).toBe(true);
    expect(reasonMatches(' ', '')).toBe(true);
    expect(reasonMatches('expired', '')).toBe(false);
  });

  it('replays with x-death-reason dropped, the count incremented and the time set', () => {
    const headers = { 'x-death-reason': 'a: b', 'x-replay-count': 2, 'x-user': 'u', 'x-death': [] };
    expect(replayHeaders(headers, 42, (name) => name === 'x-death')).toEqual({
      'x-user': 'u',
      'x-replay-count': 3,
      'x-replayed-at': 42,
    });
  });

  it('numbers repeated base ids', () => {
    const ids = new OccurrenceIds();
    expect([ids.next('a'), ids.next('b'), ids.next('a'), ids.next('a')]).toEqual([
      'a',
      'b',
      'a~2',
      'a~3',
    ]);
  });

  it('sorts each distinct id into exactly one list', async () => {
    const result = await actOnEach(['a', 'b', 'a', 'c'], async (id) => {
      if (id === 'c') throw new Error('broken');
      return id === 'a' ? 'done' : 'missing';
    });
    expect(result).toEqual({ done: ['a'], missing: ['b'], failed: [{ id: 'c', error: 'broken' }] });
  });

  it('runs the work on one channel one at a time, even after a failure', async () => {
    const locks = new ChannelLocks();
    const order: string[] = [];
    let release!: () => void;
    const first = locks.run('q', async () => {
      order.push('first start');
      await new Promise<void>((resolve) => (release = resolve));
      order.push('first end');
      throw new Error('failed');
    });
    const second = locks.run('q', async () => void order.push('second'));
    await new Promise((resolve) => setImmediate(resolve));
    release();
    await expect(first).rejects.toThrow('failed');
    await second;
    expect(order).toEqual(['first start', 'first end', 'second']);
  });
});
