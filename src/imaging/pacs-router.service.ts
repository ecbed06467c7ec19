import { Injectable } from '@nestjs/common';
import { SplitterService, type SequenceReceipt } from 'nest-sequence';
import { syntheticStudy } from './dicom-like.records';
import { INTAKE_CHANNEL } from './imaging.channels';

const FRAGMENT_BYTES = 8 * 1024 * 1024;

/** The sending side: a PACS router forwarding a study to the AI service. */
@Injectable()
export class PacsRouterService {
  constructor(private readonly splitter: SplitterService) {}

  /** Sends one study record-aware: no record is cut across two fragments. */
  sendStudy(studyUid: string, totalBytes: number): Promise<SequenceReceipt> {
    return this.splitter.send(
      INTAKE_CHANNEL,
      { records: syntheticStudy(totalBytes) },
      {
        fragmentBytes: FRAGMENT_BYTES,
        contentType: 'application/x-dicom-like',
        headers: { 'study-uid': studyUid, modality: 'CT' },
      },
    );
  }
}
