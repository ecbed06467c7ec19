import { Logger } from '@nestjs/common';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import { leaseClock } from '../core/lease-clock';
import { DrainLease } from './drain-lease';

describe('DrainLease', () => {
  afterEach(() => jest.restoreAllMocks());

  it('counts the lease lost after leaseMs of real time, whatever the wall clock does', async () => {
    // Renewals never reach the store: the lease lapses there leaseMs after the claim.
    const renewDrain = jest.fn().mockRejectedValue(new Error('connection lost'));
    const store = { renewDrain } as unknown as ResequencerStore;
    const leaseMs = 300;
    const logger = new Logger('DrainLeaseSpec');
    jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
    const lease = new DrainLease(
      store,
      { scope: 's', key: 'k' },
      'h',
      leaseMs,
      leaseClock(),
      logger,
    );
    try {
      expect(lease.lost()).toBe(false);
      // The wall clock steps back a minute (an NTP step).
      const wall = Date.now();
      jest.spyOn(Date, 'now').mockImplementation(() => wall - 60_000);
      await new Promise((resolve) => setTimeout(resolve, 2 * leaseMs));
      expect(renewDrain).toHaveBeenCalled();
      expect(lease.lost()).toBe(true);
    } finally {
      lease.stop();
    }
  });

  it('counts the lease lost after leaseMs of wall-clock time, while the monotonic clock stood still', async () => {
    // A suspended machine: its monotonic clock stops, its wall clock (and Redis's) goes on.
    const renewDrain = jest.fn().mockRejectedValue(new Error('connection lost'));
    const store = { renewDrain } as unknown as ResequencerStore;
    const logger = new Logger('DrainLeaseSpec');
    jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
    const lease = new DrainLease(store, { scope: 's', key: 'k' }, 'h', 300, leaseClock(), logger);
    try {
      expect(lease.lost()).toBe(false);
      const mono = performance.now();
      const wall = Date.now();
      jest.spyOn(performance, 'now').mockImplementation(() => mono);
      jest.spyOn(Date, 'now').mockImplementation(() => wall + 60_000);
      expect(lease.lost()).toBe(true);
    } finally {
      lease.stop();
    }
  });
});
