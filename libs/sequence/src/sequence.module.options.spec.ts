import { Test } from '@nestjs/testing';
import { SequenceModule, SequenceOptionsError } from 'nest-sequence';

/** Typed configuration, as class-transformer's plainToInstance or a config class would give it. */
class SequenceConfig {
  shutdownTimeoutMs = 5_000;
  // A typo: must be refused, whichever way the options reach the module.
  handlerTimeotMs = 1_000;
}

async function bootstrapError(
  imports: ReturnType<typeof SequenceModule.forRoot>,
): Promise<unknown> {
  try {
    const moduleRef = await Test.createTestingModule({ imports: [imports] }).compile();
    await moduleRef.close();
    return undefined;
  } catch (error) {
    return error;
  }
}

describe('SequenceModule: forRoot and forRootAsync check the same options alike', () => {
  it('forRoot refuses the misspelt key of a config object', async () => {
    const error = await bootstrapError(SequenceModule.forRoot(new SequenceConfig()));
    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(String((error as Error).message)).toMatch(/handlerTimeotMs is not an option/);
  });

  it('forRootAsync (useFactory) refuses the same misspelt key', async () => {
    const error = await bootstrapError(
      SequenceModule.forRootAsync({
        useFactory: () => new SequenceConfig(),
      }),
    );
    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(String((error as Error).message)).toMatch(/handlerTimeotMs is not an option/);
  });
});
