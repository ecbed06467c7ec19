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

  it('never cuts inside a character of two UTF-16 units (an emoji)', () => {
    const prefix = 'handler-failed: ';
    const detail = 'x'.repeat(MAX_DEATH_REASON_CHARS - 2 - prefix.length) + '😀'.repeat(10);

    const reason = deathReason('handler-failed', detail);

    expect(reason.endsWith('x…')).toBe(true);
    expect(Buffer.from(reason, 'utf8').toString('utf8')).toBe(reason);
  });

  it('writes a lone surrogate of the detail as U+FFFD, as UTF-8 would carry it', () => {
    expect(deathReason('handler-failed', 'bad \ud800 input')).toBe(
      'handler-failed: bad \ufffd input',
    );
  });
});
