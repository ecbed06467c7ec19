import { parseArgs } from 'node:util';
import { ProducerAppModule } from './app.module';
import {
  createDemoApp,
  requireBroker,
  requireSharedKey,
  runToCompletion,
  StderrLogger,
  USAGE_ERROR,
} from './demo.command';
import { MIN_STUDY_BYTES } from './demo.environment';
import { PacsRouterService } from './imaging/pacs-router.service';

const USAGE = 'usage: npm run demo:producer -- --bytes N   (N: study size in bytes, e.g. 30000000)';

/**
 * `npm run demo:producer -- --bytes N`: sends one synthetic study of N bytes to
 * `imaging.ai.intake` (in fragments of at most 8 MiB, or on NATS of what its max_payload allows;
 * or above CLAIM_CHECK_ABOVE_BYTES parked in
 * the payload store behind a signed ticket), prints the receipt as JSON and exits.
 */
async function main(): Promise<number> {
  const studyBytes = parseStudyBytes(process.argv.slice(2));
  if (typeof studyBytes === 'string') {
    console.error(`demo:producer: ${studyBytes}\n${USAGE}`);
    return USAGE_ERROR;
  }
  requireBroker('demo:producer');
  requireSharedKey('demo:producer');
  // Warnings and errors only, on stderr: stdout carries the receipt alone, for scripts to read.
  const app = await createDemoApp(
    ProducerAppModule,
    new StderrLogger('demo:producer', { logLevels: ['error', 'warn'] }),
  );
  try {
    const studyUid = `1.2.840.99999.${Date.now()}`;
    const { ticket, ...receipt } = await app.get(PacsRouterService).sendStudy(studyUid, studyBytes);
    // Where the study was parked, not the ticket itself: a signed ticket is for the consumer.
    const parked = ticket && { store: ticket.store, ref: ticket.ref, expiresAt: ticket.expiresAt };
    console.log(JSON.stringify({ studyUid, ...receipt, ...(parked && { ticket: parked }) }));
    return 0;
  } finally {
    await app.close();
  }
}

/** The study size from `--bytes N` (or `--bytes=N`), N a plain whole number; else what is wrong. */
function parseStudyBytes(args: string[]): number | string {
  let bytes: string | undefined;
  try {
    ({ bytes } = parseArgs({ args, options: { bytes: { type: 'string' } }, strict: true }).values);
  } catch (error) {
    return (error as Error).message; // an unknown option, a stray argument, a missing value
  }
  if (bytes === undefined) return '--bytes is required';
  const value = Number(bytes);
  if (!/^\d+$/.test(bytes) || !Number.isSafeInteger(value) || value < MIN_STUDY_BYTES) {
    return `--bytes must be a whole number of bytes, at least ${MIN_STUDY_BYTES}, got ${JSON.stringify(bytes)}`;
  }
  return value;
}

runToCompletion(main);
