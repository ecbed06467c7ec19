import { DemoEnvironmentError } from '../demo-environment.error';
import { transferChannels, type TransferChannels } from './transfer-status.channels';

/** What the transfers module needs: where statuses travel, and how long a gap may stay open. */
export interface TransfersSettings {
  readonly channels: TransferChannels;
  /** How long a transfer may wait for a missing status before the resequencer raises an alert. */
  readonly gapTimeoutMs: number;
}

/** What `npm run demo:transfers` reads from the environment (besides the adapters). */
export interface TransfersEnvironment extends TransfersSettings {
  /** `TRANSFERS`: how many transfers the upstream services simulate. @default 200 */
  readonly transfers: number;
  /** `PORT`: the HTTP port; 0 picks a free one. @default 3000 */
  readonly port: number;
  /** `SERVE=1`: keep serving the HTTP API after the summary, until SIGTERM or Ctrl-C. */
  readonly serve: boolean;
}

export const TRANSFERS_DEFAULTS = {
  transfers: 200,
  gapTimeoutMs: 3_000,
  port: 3_000,
} as const;

/** Enough to show the pattern at scale, few enough that a typo cannot exhaust memory. */
const MAX_TRANSFERS = 100_000;
const MAX_GAP_TIMEOUT_MS = 3_600_000;
const MAX_PORT = 65_535;
/** Channel (queue) names keep to what every broker accepts. */
const CHANNEL_PREFIX = /^[A-Za-z0-9._:-]{0,64}$/;

/**
 * Reads and checks the transfers demo's settings; every problem is reported at once.
 * @throws DemoEnvironmentError naming each variable that is wrong and how to fix it
 */
export function readTransfersEnvironment(
  env: NodeJS.ProcessEnv = process.env,
): TransfersEnvironment {
  const variables: string[] = [];
  const problems: string[] = [];
  const wholeNumber = (variable: string, fallback: number, min: number, max: number): number => {
    const text = env[variable];
    if (text === undefined || text === '') return fallback;
    const value = Number(text);
    if (/^\d+$/.test(text) && value >= min && value <= max) return value;
    variables.push(variable);
    problems.push(
      `${variable} must be a whole number from ${min} to ${max}, got ${JSON.stringify(text)}`,
    );
    return fallback;
  };

  const transfers = wholeNumber('TRANSFERS', TRANSFERS_DEFAULTS.transfers, 1, MAX_TRANSFERS);
  const gapTimeoutMs = wholeNumber(
    'TRANSFER_GAP_TIMEOUT_MS',
    TRANSFERS_DEFAULTS.gapTimeoutMs,
    1,
    MAX_GAP_TIMEOUT_MS,
  );
  const port = wholeNumber('PORT', TRANSFERS_DEFAULTS.port, 0, MAX_PORT);
  const prefix = env.TRANSFERS_CHANNEL_PREFIX ?? '';
  if (!CHANNEL_PREFIX.test(prefix)) {
    variables.push('TRANSFERS_CHANNEL_PREFIX');
    problems.push(
      `TRANSFERS_CHANNEL_PREFIX may hold up to 64 of A-Z a-z 0-9 . _ : -, got ${JSON.stringify(prefix)}`,
    );
  }
  const serve = env.SERVE ?? '';
  if (!['', '0', '1'].includes(serve)) {
    variables.push('SERVE');
    problems.push(`SERVE must be 1 (keep serving) or 0, got ${JSON.stringify(serve)}`);
  }

  if (problems.length > 0) throw new DemoEnvironmentError(variables, problems);
  return {
    transfers,
    gapTimeoutMs,
    port,
    serve: serve === '1',
    channels: transferChannels(prefix),
  };
}
