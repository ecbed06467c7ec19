import { SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { AppModule } from './app.module';
import { createDemoApp, runToCompletion } from './demo.command';
import { RESULTS_CHANNEL, type StudyReport } from './imaging/imaging.channels';
import { PacsRouterService } from './imaging/pacs-router.service';

const MB = 1024 * 1024;
const REPORT_TIMEOUT_MS = 300_000;

/**
 * `npm start`: both roles in one process. Sends one synthetic study through Message Sequence and
 * waits for the AI service's report; on RabbitMQ and Redis when AMQP_URL and REDIS_URL are set.
 */
async function main(): Promise<number> {
  const studyBytes = Number(process.env.STUDY_BYTES ?? 180 * MB);
  const app = await createDemoApp(AppModule);
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
    const deadline = Date.now() + REPORT_TIMEOUT_MS;
    while (!reports.has(receipt.sequenceId)) {
      if (Date.now() > deadline)
        throw new Error(`no report for ${receipt.sequenceId} within ${REPORT_TIMEOUT_MS} ms`);
      await new Promise<void>((resolve) => {
        reportArrived = resolve;
        setTimeout(resolve, 1_000);
      });
    }
    const report = reports.get(receipt.sequenceId)!;
    const elapsedMs = Date.now() - started;
    const matched = report.sha256 === receipt.sha256 && report.bytes === receipt.bytes;

    console.log(
      [
        `study ${report.studyUid}: ${receipt.fragments} fragments, ${receipt.bytes} bytes`,
        `  sent and reassembled in ${elapsedMs} ms (${(receipt.bytes / MB / (elapsedMs / 1000)).toFixed(1)} MB/s)`,
        `  ${report.records} records analysed, mean intensity ${report.meanIntensity.toFixed(2)}`,
        `  sha256 ${receipt.sha256} ${matched ? 'matched' : 'DID NOT MATCH'}`,
      ].join('\n'),
    );
    return matched ? 0 : 1;
  } finally {
    await app.close();
  }
}

runToCompletion(main);
