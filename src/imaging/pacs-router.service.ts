import { Injectable } from '@nestjs/common';
import { ClaimCheckService, type ClaimPublishReceipt } from 'nest-sequence';
import { syntheticStudy } from './dicom-like.records';
import { INTAKE_CHANNEL } from './imaging.channels';

/** The sending side: a PACS router forwarding a study to the AI service. */
@Injectable()
export class PacsRouterService {
  constructor(private readonly claimCheck: ClaimCheckService) {}

  /**
   * Sends one study, choosing the way by its size (`mode: 'auto'`): inline up to 256 KiB; a
   * Message Sequence, record-aware (no record cut across two fragments), up to the module's
   * `claimCheck.sequenceMaxBytes` (CLAIM_CHECK_ABOVE_BYTES); above it, parked in the payload
   * store as it is generated and sent as a signed ticket.
   */
  sendStudy(studyUid: string, totalBytes: number): Promise<ClaimPublishReceipt> {
    return this.claimCheck.publish(
      INTAKE_CHANNEL,
      { records: syntheticStudy(totalBytes) },
      {
        mode: 'auto',
        bytes: totalBytes,
        contentType: 'application/x-dicom-like',
        headers: { 'study-uid': studyUid, modality: 'CT' },
      },
    );
  }
}
