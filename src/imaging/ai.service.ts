import { Inject, Injectable, Logger } from '@nestjs/common';
import {
  ReassembledPayload,
  SEQUENCE_TRANSPORT,
  SequencedHandler,
  type Transport,
} from 'nest-sequence';
import { readRecords } from './dicom-like.records';
import { INTAKE_CHANNEL, RESULTS_CHANNEL, type StudyReport } from './imaging.channels';

/** The receiving side: an AI service that analyses every record of a complete, verified study. */
@Injectable()
export class AiService {
  private readonly logger = new Logger(AiService.name);

  constructor(@Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport) {}

  @SequencedHandler({ channel: INTAKE_CHANNEL, timeout: { ms: 120_000, strategy: 'sliding' } })
  async analyse(study: ReassembledPayload): Promise<void> {
    let records = 0;
    let intensity = 0;
    // stream() reads the study from the store fragment by fragment: never one 180 MB buffer.
    for await (const record of readRecords(study.stream())) {
      records++;
      intensity += meanByte(record.value);
    }
    const report: StudyReport = {
      sequenceId: study.sequenceId,
      studyUid: String(study.headers['study-uid']),
      fragments: study.fragments,
      bytes: study.bytes,
      sha256: study.sha256,
      records,
      meanIntensity: records === 0 ? 0 : intensity / records,
      status: 'ok',
    };
    this.logger.log(`study ${report.studyUid}: ${records} records analysed`);
    await this.transport.publish(RESULTS_CHANNEL, Buffer.from(JSON.stringify(report)), {
      'content-type': 'application/json',
    });
  }
}

function meanByte(value: Buffer): number {
  let sum = 0;
  for (let i = 0; i < value.length; i++) sum += value[i];
  return value.length === 0 ? 0 : sum / value.length;
}
