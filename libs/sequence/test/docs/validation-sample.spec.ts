import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Test } from '@nestjs/testing';
import { SequenceModule, SequenceOptionsError, type SequenceModuleOptions } from '../../src';

/**
 * configuration.md shows what a `SequenceOptionsError` says under `## Validation`. The options
 * below are the ones its lines describe; the module must say exactly those lines, so that the
 * sample (the list of `sequence` keys above all) follows the options as they change.
 */
const ROOT = join(__dirname, '../../../..');

/** The sample's options, each line of the sample naming one of their problems. */
const SAMPLE_OPTIONS = {
  sweepIntervalMs: 60_000,
  sequence: { timeotMs: 60_000 },
  handlerRetry: { baseDelayMs: 60_000, maxDelayMs: 30_000 },
  prefetch: '32',
} as unknown as SequenceModuleOptions;

/** The fenced block under `## Validation` that starts with the error's first line. */
function sample(): string {
  const text = readFileSync(join(ROOT, 'docs/configuration.md'), 'utf8');
  const section = text.slice(text.indexOf('## Validation'));
  const block = /```\n(invalid SequenceModule options:\n[\s\S]*?)\n```/.exec(section);
  if (!block) throw new Error('configuration.md: no SequenceOptionsError sample under Validation');
  return block[1];
}

describe("configuration.md's validation sample", () => {
  it('is what the module says of the options it describes', async () => {
    let thrown: unknown;
    try {
      const app = await Test.createTestingModule({
        imports: [SequenceModule.forRoot(SAMPLE_OPTIONS)],
      }).compile();
      await app.close();
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(SequenceOptionsError);
    expect((thrown as SequenceOptionsError).message).toBe(sample());
  });
});
