import { createHash } from 'node:crypto';
import { Inject, Injectable } from '@nestjs/common';
import { ClientProxy } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { SequenceRecord } from 'nest-sequence/microservices';
import { syntheticStudy } from '../imaging/dicom-like.records';
import { INTAKE_CHANNEL } from '../imaging/imaging.channels';
import { STUDY_HEADER } from './study-metadata.decorator';

/** The injection token of the PACS router's `SequenceClient`. */
export const IMAGING_CLIENT = 'IMAGING_CLIENT';

/** What the sender knows of a study once `emit` completed. */
export interface SentStudy {
  readonly bytes: number;
  /** SHA-256 of the bytes sent, computed as they were generated. */
  readonly sha256: string;
}

/** The sending side: a PACS router emitting studies through a `SequenceClient`. */
@Injectable()
export class StudySender {
  constructor(@Inject(IMAGING_CLIENT) private readonly client: ClientProxy) {}

  /**
   * Emits one synthetic study of `totalBytes` to `imaging.ai.intake`, its metadata as JSON in the
   * `x-study` header (sent as given: the receiving side validates it). The client picks the way by
   * size: inline, a Message Sequence (record-aware: no record cut across two fragments; the size
   * is given so that it may), or a claim ticket above `claimCheck.sequenceMaxBytes`. Resolves
   * once the transport confirmed every message.
   */
  async send(metadata: object, totalBytes: number): Promise<SentStudy> {
    const hash = createHash('sha256');
    function* hashed(): Generator<Buffer> {
      for (const record of syntheticStudy(totalBytes)) {
        hash.update(record);
        yield record;
      }
    }
    const study = new SequenceRecord(
      { records: hashed() },
      {
        bytes: totalBytes,
        contentType: 'application/x-dicom-like',
        headers: { [STUDY_HEADER]: JSON.stringify(metadata) },
      },
    );
    await lastValueFrom(this.client.emit(INTAKE_CHANNEL, study));
    return { bytes: totalBytes, sha256: hash.digest('hex') };
  }
}
