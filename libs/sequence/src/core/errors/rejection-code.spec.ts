import { deathReason, MAX_DEATH_REASON_CHARS } from './rejection-code';

describe('deathReason', () => {
  it('is the code, then the detail', () => {
    expect(deathReason('crc-mismatch', 'fragment 2 of seq-1')).toBe(
      'crc-mismatch: fragment 2 of seq-1',
    );
  });

  it('cuts a long detail (a handler error quoting its input) to MAX_DEATH_REASON_CHARS', () => {
    const reason = deathReason('handler-failed', 'x'.repeat(100_000));

    expect(reason).toHaveLength(MAX_DEATH_REASON_CHARS);
    expect(reason.startsWith('handler-failed: xxx')).toBe(true);
    expect(reason.endsWith('…')).toBe(true);
  });
});
