import { describeClaimLedgerConformance } from '../../../testing/conformance/claim-ledger.conformance';
import type { ClaimKey } from '../../../ports/claim-ledger.port';
import { MemoryClaimLedger } from './memory.claim-ledger';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

describeClaimLedgerConformance('memory', {
  create: async () => new MemoryClaimLedger(),
  // One process, one ledger: a second consumer in it shares the same object.
  peer: async (ledger) => ledger,
});

describe('MemoryClaimLedger', () => {
  const t0 = 1_000_000;
  const LEASE_MS = 1_000;
  const RETAIN_MS = 60_000;
  const keyOf = (index: number): ClaimKey => ({ ticket: `filesystem:t${index}`, group: 'g' });

  it('drops a completion once its retainUntil has passed, on the next sweep', async () => {
    const ledger = new MemoryClaimLedger({ sweepIntervalMs: 10_000 });
    await ledger.complete(keyOf(1), 'a', t0 + 1_000, t0);
    await ledger.claim(keyOf(2), 'a', LEASE_MS, t0);
    expect(ledger.entries).toBe(2);

    await ledger.claim(keyOf(3), 'a', LEASE_MS, t0 + 20_000);

    expect(ledger.entries).toBe(1);
  });

  it('does not sweep more often than sweepIntervalMs', async () => {
    const ledger = new MemoryClaimLedger({ sweepIntervalMs: 10_000 });
    await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
    await ledger.claim(keyOf(2), 'a', LEASE_MS, t0 + 5_000);

    expect(ledger.entries).toBe(2);
  });

  it('drops a lease that lapsed, on the next sweep', async () => {
    const ledger = new MemoryClaimLedger({ sweepIntervalMs: 0 });
    await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
    expect(ledger.entries).toBe(1);

    await ledger.complete(keyOf(2), 'a', t0 + RETAIN_MS, t0 + LEASE_MS);

    expect(ledger.entries).toBe(1);
  });

  it('turns a lease into a completion without growing', async () => {
    const ledger = new MemoryClaimLedger();
    await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
    await ledger.complete(keyOf(1), 'a', t0 + RETAIN_MS, t0 + 1);

    expect(ledger.entries).toBe(1);
  });

  it('removes a released lease at once', async () => {
    const ledger = new MemoryClaimLedger();
    await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
    await ledger.release(keyOf(1), 'a');

    expect(ledger.entries).toBe(0);
  });

  describe('at maxEntries', () => {
    const SWEEP_RARELY = { sweepIntervalMs: 1_000_000_000 };

    it('evicts the oldest completion to admit a new claim', async () => {
      const ledger = new MemoryClaimLedger({ maxEntries: 3, ...SWEEP_RARELY });
      for (const index of [1, 2, 3]) {
        await ledger.complete(keyOf(index), 'a', t0 + RETAIN_MS, t0 + index);
      }

      await expect(ledger.claim(keyOf(4), 'a', LEASE_MS, t0 + 10)).resolves.toBe('claimed');

      expect(ledger.entries).toBe(3);
      await expect(ledger.claim(keyOf(1), 'b', LEASE_MS, t0 + 11)).resolves.toBe('claimed');
      await expect(ledger.claim(keyOf(3), 'b', LEASE_MS, t0 + 12)).resolves.toBe('done');
    });

    it('drops lapsed leases before evicting any completion', async () => {
      const ledger = new MemoryClaimLedger({ maxEntries: 3, ...SWEEP_RARELY });
      await ledger.complete(keyOf(1), 'a', t0 + RETAIN_MS, t0);
      await ledger.claim(keyOf(2), 'a', LEASE_MS, t0);
      await ledger.claim(keyOf(3), 'a', LEASE_MS, t0);

      await expect(ledger.claim(keyOf(4), 'a', LEASE_MS, t0 + LEASE_MS)).resolves.toBe('claimed');

      expect(ledger.entries).toBe(2);
      await expect(ledger.claim(keyOf(1), 'b', LEASE_MS, t0 + LEASE_MS)).resolves.toBe('done');
    });

    it('answers busy to a new claim when every record is a live lease, and still renews', async () => {
      const ledger = new MemoryClaimLedger({ maxEntries: 2, ...SWEEP_RARELY });
      await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
      await ledger.claim(keyOf(2), 'a', LEASE_MS, t0);

      await expect(ledger.claim(keyOf(3), 'a', LEASE_MS, t0 + 1)).resolves.toBe('busy');
      await expect(ledger.claim(keyOf(1), 'a', LEASE_MS, t0 + 1)).resolves.toBe('claimed');
      expect(ledger.entries).toBe(2);
    });

    it('never refuses a completion, keeping the one just recorded', async () => {
      const ledger = new MemoryClaimLedger({ maxEntries: 2, ...SWEEP_RARELY });
      await ledger.claim(keyOf(1), 'a', LEASE_MS, t0);
      await ledger.claim(keyOf(2), 'a', LEASE_MS, t0);

      await expect(ledger.complete(keyOf(3), 'a', t0 + RETAIN_MS, t0 + 1)).resolves.toEqual({
        groups: 1,
        first: true,
      });
      await expect(ledger.claim(keyOf(3), 'b', LEASE_MS, t0 + 2)).resolves.toBe('done');
    });
  });

  it('forgets everything on close', async () => {
    const ledger = new MemoryClaimLedger();
    await ledger.complete(keyOf(1), 'a', t0 + RETAIN_MS, t0);
    await ledger.close();

    expect(ledger.entries).toBe(0);
  });

  it.each([[{ maxEntries: 0 }], [{ maxEntries: 1.5 }], [{ sweepIntervalMs: -1 }]])(
    'rejects the options %j',
    (options) => {
      expect(() => new MemoryClaimLedger(options)).toThrow(SequenceOptionsError);
      const [[name, value]] = Object.entries(options);
      expect(() => new MemoryClaimLedger(options)).toThrow(`${name} must be an integer >= `);
      expect(() => new MemoryClaimLedger(options)).toThrow(`got ${String(value)}`);
    },
  );
});
