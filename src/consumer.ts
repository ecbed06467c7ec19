import { Logger } from '@nestjs/common';
import { ConsumerAppModule } from './app.module';
import { createDemoApp, exitOnError, requireBroker, requireSharedKey } from './demo.command';
import { INTAKE_CHANNEL, RESULTS_CHANNEL } from './imaging/imaging.channels';

/**
 * `npm run demo:consumer`: the AI service alone. Takes every study sent to `imaging.ai.intake`
 * (by the demo's producer or any program following the wire contract), inline, as a sequence or
 * behind a claim ticket, and publishes a JSON report per study to `imaging.ai.results`, until
 * SIGINT or SIGTERM.
 */
async function main(): Promise<void> {
  requireBroker('demo:consumer');
  requireSharedKey('demo:consumer');
  const app = await createDemoApp(ConsumerAppModule);
  // On a signal: take no new messages, let studies in progress finish, close, exit 0.
  app.enableShutdownHooks(['SIGINT', 'SIGTERM'], { useProcessExit: true });
  new Logger('demo:consumer').log(
    `consuming ${INTAKE_CHANNEL}, reporting to ${RESULTS_CHANNEL}; stop with Ctrl-C`,
  );
}

main().catch(exitOnError);
