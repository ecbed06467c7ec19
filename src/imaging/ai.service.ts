import { Inject, Injectable, Logger } from '@nestjs/common';
import { ClaimCheck, ClaimedPayload, SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { readRecords } from './dicom-like.records';
import {
  deliveryIdOf,
  INTAKE_CHANNEL,
  RESULTS_CHANNEL,
  type StudyReport,
} from './imaging.channels';

/** The receiving side: an AI service that analyses every record of a complete, verified study. */
@Injectable()
export class AiService {
  private readonly logger = new Logger(AiService.name);

  constructor(@Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport) {}

  /**
   * Takes a study whichever way it came: inline, reassembled from a Message Sequence (its
   * fragments may arrive up to 120 s apart), or from the payload store behind a ticket.
   */
  @ClaimCheck({
    channel: INTAKE_CHANNEL,
    sequence: { timeoutMs: 120_000, timeoutStrategy: 'sliding' },
  })
  async analyse(study: ClaimedPayload): Promise<void> {
    let records = 0;
    let intensity = 0;
    // stream() reads the study piece by piece (fragment by fragment from the sequence store, or
    // chunk by chunk from the payload store, verifying the ticket's SHA-256): never one 180 MB
    // buffer. A parked study whose bytes do not match makes it throw at its end.
    for await (const record of readRecords(study.stream())) {
      records++;
      intensity += meanByte(record.value);
    }
    const report: StudyReport = {
      sequenceId: deliveryIdOf(study),
      studyUid: String(study.headers['study-uid']),
      via: study.via,
      fragments: study.fragments,
      bytes: study.bytes,
      sha256: study.sha256,
      records,
      meanIntensity: records === 0 ? 0 : intensity / records,
      status: 'ok',
    };
    this.logger.log(`study ${report.studyUid}: ${records} records analysed (via ${study.via})`);
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
