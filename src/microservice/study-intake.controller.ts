import { createHash, type Hash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { Controller, Logger, ValidationPipe } from '@nestjs/common';
import { Ctx, EventPattern, Payload } from '@nestjs/microservices';
import { MessageRefusedError, type SequenceContext } from 'nest-sequence/microservices';
import { readRecords } from '../imaging/dicom-like.records';
import { INTAKE_CHANNEL } from '../imaging/imaging.channels';
import { StudyIntakeLedger } from './study-intake.ledger';
import { StudyMetadata } from './study-metadata.decorator';
import { StudyMetadataDto } from './study-metadata.dto';

/** Checks the `x-study` header against the DTO; unknown fields are refused too. */
const STUDY_VALIDATION = new ValidationPipe({
  validateCustomDecorators: true,
  transform: true,
  whitelist: true,
  forbidNonWhitelisted: true,
});

/**
 * The AI service's intake as a Nest microservice handler. The study's bytes are the payload, a
 * stream read record by record (a 180 MB study is never one buffer); its metadata travels as JSON
 * in the `x-study` header and is validated before the handler runs.
 */
@Controller()
export class StudyIntakeController {
  private readonly logger = new Logger(StudyIntakeController.name);

  constructor(private readonly ledger: StudyIntakeLedger) {}

  @EventPattern(INTAKE_CHANNEL)
  async intake(
    @Payload() study: Readable,
    @StudyMetadata(STUDY_VALIDATION) metadata: StudyMetadataDto,
    @Ctx() context: SequenceContext,
  ): Promise<void> {
    const hash = createHash('sha256');
    let records = 0;
    let bytes = 0;
    // The stream must be read before the handler returns: the sequence's fragments (or the
    // parked payload) are released once it has.
    for await (const _record of readRecords(hashing(study, hash, (n) => (bytes += n)))) records++;
    const sha256 = hash.digest('hex');

    this.logger.log(
      `study ${metadata.studyUid} (${metadata.modality}): ${records} records, ${bytes} bytes ` +
        `via ${context.getVia()}, sha256 ${sha256}`,
    );
    // Recorded even if refused below: the command compares it with what it sent.
    this.ledger.record({
      studyUid: metadata.studyUid,
      modality: metadata.modality,
      via: context.getVia(),
      fragments: context.getFragments(),
      bytes,
      records,
      sha256,
    });

    // The library checks a sequence's and a ticket's SHA-256 as it streams them; the handler
    // checks what it read against what the sender declared, in the wire contract and the header.
    const declared = context.getSha256();
    const problems = [
      ...(declared !== undefined && declared !== sha256
        ? [`its SHA-256 is ${sha256}, the sender declared ${declared}`]
        : []),
      ...(bytes !== metadata.bytes
        ? [`${bytes} bytes arrived, x-study says ${metadata.bytes}`]
        : []),
    ];
    if (problems.length > 0) {
      throw new MessageRefusedError(
        'invalid-payload',
        `study ${metadata.studyUid}: ${problems.join('; ')}`,
      );
    }
  }
}

/** The stream's chunks, each added to `hash` and counted as it passes. */
async function* hashing(
  chunks: AsyncIterable<Buffer>,
  hash: Hash,
  counted: (bytes: number) => void,
): AsyncGenerator<Buffer> {
  for await (const chunk of chunks) {
    hash.update(chunk);
    counted(chunk.length);
    yield chunk;
  }
}
