import { SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { AppModule } from './app.module';
import { createDemoApp, runUntilServingOrDone } from './demo.command';
import { readDemoEnvironment } from './demo.environment';
import { deliveryIdOf, RESULTS_CHANNEL, type StudyReport } from './imaging/imaging.channels';
import { PacsRouterService } from './imaging/pacs-router.service';
import { serveConsole } from './operator-console';

const MB = 1024 * 1024;
const REPORT_TIMEOUT_MS = 300_000;

/** What the receiving side did with the study, by the way it travelled. */
const RECEIVED = { sequence: 'reassembled', ticket: 'claimed', inline: 'received' } as const;

/**
 * `npm start`: both roles in one process. Sends one synthetic study (as a Message Sequence, or
 * through the claim check above CLAIM_CHECK_ABOVE_BYTES) and waits for the AI service's report; on
 * RabbitMQ (AMQP_URL) or NATS JetStream (NATS_URL), and Redis (REDIS_URL), when they are set.
 * With CONSOLE_PORT, the operator console is served from the start, and still after the run,
 * until Ctrl-C.
 */
async function main(): Promise<number | 'serving'> {
  const { studyBytes, consolePort } = readDemoEnvironment(process.env);
  let serving = false;
  const app =
    consolePort === undefined
      ? await createDemoApp(AppModule)
      : await serveConsole(consolePort, () => serving);
  try {
    const transport = app.get<Transport>(SEQUENCE_TRANSPORT);
    const reports = new Map<string, StudyReport>();
    let reportArrived = () => {};
    await transport.subscribe(RESULTS_CHANNEL, async (message) => {
      const report = JSON.parse(message.body.toString('utf8')) as StudyReport;
      reports.set(report.sequenceId, report);
      reportArrived();
      return { action: 'ack' };
    });

    const started = Date.now();
    const receipt = await app.get(PacsRouterService).sendStudy('1.2.840.99999.1', studyBytes);
    const id = deliveryIdOf(receipt);
    const deadline = Date.now() + REPORT_TIMEOUT_MS;
    while (!reports.has(id)) {
      if (Date.now() > deadline)
        throw new Error(`no report for ${id} within ${REPORT_TIMEOUT_MS} ms`);
      await new Promise<void>((resolve) => {
        reportArrived = resolve;
        setTimeout(resolve, 1_000);
      });
    }
    const report = reports.get(id)!;
    const elapsedMs = Date.now() - started;
    const matched =
      report.sha256 === receipt.sha256 &&
      report.bytes === receipt.bytes &&
      report.via === receipt.via;
    const fragments = `${receipt.fragments} fragment${receipt.fragments === 1 ? '' : 's'}`;

    console.log(
      [
        `study ${report.studyUid}: ${fragments}, ${receipt.bytes} bytes, via ${receipt.via}`,
        `  sent and ${RECEIVED[receipt.via]} in ${elapsedMs} ms (${(receipt.bytes / MB / (elapsedMs / 1000)).toFixed(1)} MB/s)`,
        `  ${report.records} records analysed, mean intensity ${report.meanIntensity.toFixed(2)}`,
        `  sha256 ${receipt.sha256} ${matched ? 'matched' : 'DID NOT MATCH'}`,
      ].join('\n'),
    );
    if (consolePort === undefined) return matched ? 0 : 1;
    console.log('the console goes on serving; Ctrl-C stops it');
    serving = true;
    return 'serving';
  } finally {
    if (!serving) await app.close();
  }
}

runUntilServingOrDone(main);
