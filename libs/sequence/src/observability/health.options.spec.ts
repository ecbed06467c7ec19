import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { resolveHealthOptions, type SequenceHealthOptions } from './health.options';

describe('resolveHealthOptions', () => {
  it('applies the documented defaults', () => {
    expect(resolveHealthOptions()).toEqual({
      warnRatio: 0.8,
      sequence: { bufferPercent: 80, oldestOpenAgeMs: 'timeout' },
      resequencer: { oldestGapAgeMs: 'timeout', openGaps: undefined },
      outbox: { lagMs: 300_000, failed: 0 },
      inbox: { lagMs: 300_000, failed: 0 },
    });
  });

  it('takes given thresholds, and false turns one off', () => {
    const resolved = resolveHealthOptions({
      warnRatio: false,
      sequence: { bufferPercent: 95, oldestOpenAgeMs: false },
      resequencer: { oldestGapAgeMs: 30_000, openGaps: 10 },
      outbox: { lagMs: 60_000, failed: false },
      inbox: { failed: 5 },
    });
    expect(resolved).toEqual({
      warnRatio: undefined,
      sequence: { bufferPercent: 95, oldestOpenAgeMs: undefined },
      resequencer: { oldestGapAgeMs: 30_000, openGaps: 10 },
      outbox: { lagMs: 60_000, failed: undefined },
      inbox: { lagMs: 300_000, failed: 5 },
    });
  });

  it('lists every bad value, with what to give instead, in one SequenceOptionsError', () => {
    const bad = {
      warnRatio: 1,
      sequence: { bufferPercent: 120, oldestOpenAgeMs: 'forever' },
      resequencer: { oldestGapAgeMs: -5, openGaps: 1.5 },
      outbox: { lagMs: 0, failed: -1 },
      inbox: 'strict',
    } as unknown as SequenceHealthOptions;
    let thrown: unknown;
    try {
      resolveHealthOptions(bad);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(SequenceOptionsError);
    const error = thrown as SequenceOptionsError;
    expect(error.code).toBe('invalid-options');
    expect(error.where).toBe('SequenceHealthModule options');
    expect(error.problems).toEqual([
      'warnRatio must be a number above 0 and below 1 (0.8 warns at 80% of each limit), or false for no warnings; got 1',
      'sequence.bufferPercent must be a percent above 0 and at most 100, or false; got 120',
      `sequence.oldestOpenAgeMs must be a whole number of ms of at least 1, 'timeout' or false; got "forever"`,
      `resequencer.oldestGapAgeMs must be a whole number of ms of at least 1, 'timeout' or false; got -5`,
      'resequencer.openGaps must be a whole number of at least 0, or false; got 1.5',
      'outbox.lagMs must be a whole number of ms of at least 1, or false; got 0',
      'outbox.failed must be a whole number of at least 0, or false; got -1',
      'inbox must be an object, got "strict"',
    ]);
  });

  it('refuses a misspelt or unknown threshold instead of keeping its default', () => {
    const misspelt = {
      warnRatio: 0.5,
      sequnce: { bufferPercent: 90 },
      sequence: { bufferPercnt: 90 },
      resequencer: { openGap: 10 },
      outbox: { lag: 60_000 },
      inbox: { failed: 0, failedCount: 3 },
    } as unknown as SequenceHealthOptions;

    expect(() => resolveHealthOptions(misspelt)).toThrow(SequenceOptionsError);
    try {
      resolveHealthOptions(misspelt);
    } catch (error) {
      expect((error as SequenceOptionsError).problems).toEqual([
        'sequnce is not an option; the options are warnRatio, sequence, resequencer, outbox, inbox',
        'sequence.bufferPercnt is not an option; sequence takes bufferPercent, oldestOpenAgeMs',
        'resequencer.openGap is not an option; resequencer takes oldestGapAgeMs, openGaps',
        'outbox.lag is not an option; outbox takes lagMs, failed',
        'inbox.failedCount is not an option; inbox takes lagMs, failed',
      ]);
    }
  });
});
