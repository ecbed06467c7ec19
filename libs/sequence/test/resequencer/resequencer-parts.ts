import { Logger } from '@nestjs/common';
import type { ResequencerMetrics } from '../../src/observability/resequencer.metrics';
import type { Transport } from '../../src/ports/transport.port';
import {
  resolveDefinition,
  resolveResequencerModuleOptions,
} from '../../src/resequencer/resequencer.options';
import { resolveSequenceOptions } from '../../src/sequence.options';

/**
 * What a Resequencer needs besides its store and targets: the definition (with `output` when
 * given), the options, a quiet logger and metrics that record nothing.
 */
export function resequencerParts(
  sequenceOptions: Parameters<typeof resolveSequenceOptions>[0],
  output?: string,
  moduleOptions: Parameters<typeof resolveResequencerModuleOptions>[0] = {},
) {
  const module = resolveResequencerModuleOptions({ drainBatch: 32, ...moduleOptions });
  const sequence = resolveSequenceOptions(sequenceOptions, {
    maxMessageBytes: 1_000_000,
  } as Transport);
  const definition = resolveDefinition(
    'test',
    { channel: 'c', output, gap: { timeoutMs: 60_000, policy: 'alert' } },
    module,
    sequence,
    (channel) => `${channel}.dlq`,
  );
  const logger = new Logger('test');
  jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
  const metrics = new Proxy({}, { get: () => () => undefined }) as ResequencerMetrics;
  return { definition, deps: { module, sequence, metrics, logger } };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
