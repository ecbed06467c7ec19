import 'reflect-metadata';
import { parseArgs } from 'node:util';
import { NestFactory } from '@nestjs/core';
import { SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { SequenceServer } from 'nest-sequence/microservices';
import { runToCompletion, USAGE_ERROR } from './demo.command';
import { readDemoEnvironment } from './demo.environment';
import { checkDemoServers } from './demo-servers';
import { INTAKE_CHANNEL } from './imaging/imaging.channels';
import { watchDeadLetters } from './microservice/dead-letter.watch';
import { MicroserviceAppModule } from './microservice/microservice-app.module';
import { StudyIntakeLedger } from './microservice/study-intake.ledger';
import { STUDY_HEADER } from './microservice/study-metadata.decorator';
import { StudySender } from './microservice/study.sender';

const MB = 1024 * 1024;
const HANDLED_TIMEOUT_MS = 300_000;
/** The study sent with invalid metadata (`--invalid`): small, it is refused unread. */
const INVALID_STUDY_BYTES = 1024 * 1024;

const USAGE = 'usage: npm run demo:microservice [-- --invalid]';

/**
 * `npm run demo:microservice`: a Nest microservice whose `@EventPattern('imaging.ai.intake')`
 * handler takes a study as a stream, its metadata validated by a ValidationPipe, and a
 * `SequenceClient` in the same application that emits one study of STUDY_BYTES to it. Prints the
 * SHA-256 the handler computed, matched against the sender's. `--invalid` also emits a study
 * whose metadata does not validate, and prints the reasons it was dead-lettered with. Over
 * RabbitMQ with AMQP_URL, NATS JetStream with NATS_URL.
 */
async function main(): Promise<number> {
  let invalid: boolean;
  try {
    invalid = parseArgs({ options: { invalid: { type: 'boolean' } } }).values.invalid ?? false;
  } catch (error) {
    console.error(`${(error as Error).message}\n${USAGE}`);
    return USAGE_ERROR;
  }
  // Refuses settings it cannot use (AMQP_URL and NATS_URL both set among them) before connecting.
  const { studyBytes } = readDemoEnvironment(process.env);
  await checkDemoServers(process.env);

  const app = await NestFactory.createMicroservice(MicroserviceAppModule, {
    // Studies reach the handler as a stream whatever their size.
    strategy: new SequenceServer({ streamAboveBytes: 0 }),
    logger: ['error', 'warn', 'log'],
  });
  try {
    await app.listen();
    const transport = app.get<Transport>(SEQUENCE_TRANSPORT);
    const sender = app.get(StudySender);
    const ledger = app.get(StudyIntakeLedger);

    const metadata = { studyUid: `1.2.840.99999.${Date.now()}`, modality: 'CT', bytes: studyBytes };
    const started = Date.now();
    const sent = await sender.send(metadata, studyBytes);
    const intake = await ledger.waitFor(metadata.studyUid, HANDLED_TIMEOUT_MS);
    const elapsedMs = Date.now() - started;
    const matched = intake.sha256 === sent.sha256 && intake.bytes === sent.bytes;
    const fragments = `${intake.fragments} fragment${intake.fragments === 1 ? '' : 's'}`;
    console.log(
      [
        `study ${intake.studyUid} (${intake.modality}): ${fragments}, ${intake.bytes} bytes, ` +
          `via ${intake.via}, on the ${transport.name} transport`,
        `  emitted and handled in ${elapsedMs} ms (${(intake.bytes / MB / (elapsedMs / 1000)).toFixed(1)} MB/s)`,
        `  ${STUDY_HEADER} validated; ${intake.records} record${intake.records === 1 ? '' : 's'} streamed through @EventPattern('${INTAKE_CHANNEL}')`,
        `  sha256 ${sent.sha256} ${matched ? 'matched' : `DID NOT MATCH (handler read ${intake.sha256})`}`,
      ].join('\n'),
    );
    if (!invalid) return matched ? 0 : 1;
    return (await showInvalidStudy(transport, sender)) && matched ? 0 : 1;
  } finally {
    await app.close();
  }
}

/** Emits a study whose metadata does not validate; prints why it was dead-lettered. */
async function showInvalidStudy(transport: Transport, sender: StudySender): Promise<boolean> {
  const metadata = { studyUid: `study-${Date.now()}`, modality: 'XR', bytes: INVALID_STUDY_BYTES };
  const header = JSON.stringify(metadata);
  const watch = await watchDeadLetters(
    transport,
    INTAKE_CHANNEL,
    (message) => message.headers[STUDY_HEADER] === header,
  );
  try {
    await sender.send(metadata, INVALID_STUDY_BYTES);
    let timer: NodeJS.Timeout | undefined;
    const deadLetter = await Promise.race([
      watch.arrived,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no dead letter on ${watch.channel} in ${HANDLED_TIMEOUT_MS} ms`)),
          HANDLED_TIMEOUT_MS,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    const reason = String(deadLetter.headers['x-death-reason']);
    console.log(
      [
        `study with ${STUDY_HEADER} ${header}: refused before the handler ran`,
        `  dead-lettered to ${watch.channel}: ${reason}`,
      ].join('\n'),
    );
    return reason.startsWith('invalid-payload: ');
  } finally {
    await watch.close();
  }
}

runToCompletion(main);
