import { deadLetterReasonLabel } from './dead-letter.metrics';

describe('deadLetterReasonLabel', () => {
  it('is the code before the first colon', () => {
    expect(deadLetterReasonLabel('crc-mismatch: sequence s-1, fragment 3: crc 1 != 2')).toBe(
      'crc-mismatch',
    );
    expect(deadLetterReasonLabel('handler-failed: a: b: c')).toBe('handler-failed');
  });

  it("takes the code of a transport's own dead letter", () => {
    expect(
      deadLetterReasonLabel("max-deliver: delivered 3 times (the consumer's max_deliver)"),
    ).toBe('max-deliver');
  });

  it('takes a bare known code', () => {
    expect(deadLetterReasonLabel('sequence-expired')).toBe('sequence-expired');
  });

  it("is 'other' for words that are not one of the module's codes (the label stays bounded)", () => {
    expect(deadLetterReasonLabel('customer 42 asked to stop: no more retries')).toBe('other');
    expect(deadLetterReasonLabel('dead-lettered by the handler')).toBe('other');
    expect(deadLetterReasonLabel('')).toBe('other');
    expect(deadLetterReasonLabel('CRC-MISMATCH: shouting')).toBe('other');
  });
});
