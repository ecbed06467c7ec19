import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  SequenceModule,
  SplitterService,
  type SequenceModuleOptions,
  type Transport,
} from 'nest-sequence';
import { mergeOptions } from './merge-options';

const apps: INestApplicationContext[] = [];

/**
 * SequenceModule alone, on `transport`: nothing consumes, so fragments stay queued to inspect.
 * Close what it booted with {@link closeSplitters} (in an `afterEach`).
 */
export async function bootSplitter(
  options: SequenceModuleOptions & { transport: Transport },
): Promise<SplitterService> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot(
        mergeOptions<SequenceModuleOptions>(
          { tuning: { sweepers: { expiry: { intervalMs: false } } } },
          options,
        ),
      ),
    ],
  }).compile();
  moduleRef.useLogger(false);
  const app = await moduleRef.init();
  apps.push(app);
  return app.get(SplitterService);
}

/** Closes every application {@link bootSplitter} booted. */
export async function closeSplitters(): Promise<void> {
  await Promise.all(apps.splice(0).map((app) => app.close()));
}
