import { Test } from '@nestjs/testing';
import { SequenceModule } from '../sequence.module';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { resolveAdminOptions } from './admin.options';
import { SequenceAdminModule } from './sequence-admin.module';

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

/**
 * A misspelt option, or one of the wrong type (a forRootAsync factory reading the environment),
 * is refused at boot, as SequenceModule's are, rather than silently keeping its default.
 */
describe('resolveAdminOptions: options it cannot take', () => {
  it.each([
    ['a misspelt mutations', { mutation: true }, /mutation is not an option/],
    ['mutations as a string', { mutations: 'true' }, /mutations must be true or false/],
    ['deadLetterChannels as a string', { deadLetterChannels: 'images.dlq' }, /deadLetterChannels/],
    ['an empty dead-letter channel', { deadLetterChannels: ['images', ''] }, /deadLetterChannels/],
  ])('refuses %s', (_, given, problem) => {
    expect(() => resolveAdminOptions(given as never)).toThrow(problem);
  });
});

describe('SequenceAdminModule.forRootAsync', () => {
  it.each([
    ['undefined (a factory that forgot its return)', undefined],
    ['null', null],
    ['a string', 'mutations'],
    ['an array', [{ mutations: true }]],
  ])('fails the bootstrap when the factory returns %s', async (_, returned) => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({ isGlobal: true }),
        SequenceAdminModule.forRootAsync({ useFactory: async () => returned as never }),
      ],
    })
      .compile()
      .catch((error: unknown) => error);

    expect(moduleRef).toBeInstanceOf(SequenceOptionsError);
    expect((moduleRef as SequenceOptionsError).message).toMatch(/options must be an object/);
  });
});
