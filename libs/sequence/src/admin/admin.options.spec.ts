import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { resolveAdminOptions } from './admin.options';

describe('resolveAdminOptions', () => {
  it('defaults to a read-only console at sequence-admin', () => {
    expect(resolveAdminOptions()).toEqual({
      path: 'sequence-admin',
      mutations: false,
      replayRatePerSecond: 20,
      maxBatch: 500,
      deadLetterChannels: [],
      guard: undefined,
    });
  });

  it('trims slashes from the path', () => {
    expect(resolveAdminOptions({ path: '/ops/sequence/' }).path).toBe('ops/sequence');
  });

  it('lists every invalid option at once', () => {
    expect(() =>
      resolveAdminOptions({ path: 'a b', replayRatePerSecond: 0, maxBatch: 5000 }),
    ).toThrow(SequenceOptionsError);
    try {
      resolveAdminOptions({ path: 'a b', replayRatePerSecond: 0, maxBatch: 5000 });
    } catch (error) {
      const message = (error as Error).message;
      expect(message).toContain('path');
      expect(message).toContain('replayRatePerSecond');
      expect(message).toContain('maxBatch');
    }
  });
});
