import { leaseClock, leaseLater, leaseLatest, leaseMsLeft } from './lease-clock';

describe('lease clock', () => {
  const at = { mono: 1_000, wall: 1_700_000_000_000 };

  it('counts the time left by the clock that has the less', () => {
    const until = leaseLater(at, 500);
    // An NTP step back: the wall clock says more is left, the monotonic one does not.
    expect(leaseMsLeft(until, { mono: 1_400, wall: at.wall - 60_000 })).toBe(100);
    // A suspension: the monotonic clock stood still, the wall clock went on.
    expect(leaseMsLeft(until, { mono: 1_000, wall: at.wall + 60_000 })).toBe(-59_500);
  });

  it('takes the later instant clock by clock', () => {
    expect(leaseLatest(at, { mono: 900, wall: at.wall + 5 })).toEqual({
      mono: 1_000,
      wall: at.wall + 5,
    });
  });

  it('reads both clocks', () => {
    const before = Date.now();
    const now = leaseClock();
    expect(now.wall).toBeGreaterThanOrEqual(before);
    expect(now.mono).toBeGreaterThan(0);
  });
});
