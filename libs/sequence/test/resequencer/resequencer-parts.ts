import { Logger } from '@nestjs/common';
import type { SequenceModuleOptions } from '../../src/options/module-options';
import { resolveModuleOptions } from '../../src/options/resolve-options';
import { resolveResequencerDefinition } from '../../src/options/resolve-resequencer';
import type { ResolvedOptions } from '../../src/options/resolved-options';
import type { ResequencerMetrics } from '../../src/resequencer/resequencer.metrics';
import type { Transport } from '../../src/ports/transport.port';

/** The module's options resolved on a transport that carries 1 MB; throws on a problem. */
export function resolvedOptions(options: SequenceModuleOptions = {}): ResolvedOptions {
  const problems: string[] = [];
  const resolved = resolveModuleOptions(problems, options, {
    maxMessageBytes: 1_000_000,
  } as Transport);
  if (problems.length > 0) throw new Error(problems.join('; '));
  return resolved;
}

/**
 * What a Resequencer needs besides its store and targets: the definition (with `output` when
 * given), the options, a quiet logger and metrics that record nothing.
 */
export function resequencerParts(options: SequenceModuleOptions, output?: string) {
  const resolved = resolvedOptions(options);
  const definition = resolveResequencerDefinition(
    'test',
    { channel: 'c', output, gap: { timeoutMs: 60_000, policy: 'alert' } },
    resolved,
    (channel: string) => `${channel}.dlq`,
  );
  const logger = new Logger('test');
  jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
  const metrics = new Proxy({}, { get: () => () => undefined }) as ResequencerMetrics;
  return { definition, deps: { options: resolved, metrics, logger } };
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
