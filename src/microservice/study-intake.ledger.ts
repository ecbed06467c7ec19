import { Injectable } from '@nestjs/common';
import type { SequenceContext } from 'nest-sequence/microservices';

/** What the intake handler found in one study it read to the end. */
export interface StudyIntake {
  readonly studyUid: string;
  readonly modality: string;
  readonly via: ReturnType<SequenceContext['getVia']>;
  readonly fragments: number;
  readonly bytes: number;
  readonly records: number;
  /** SHA-256 of the bytes the handler read, computed as it streamed them. */
  readonly sha256: string;
}

/**
 * The studies the intake handler took, for the command that runs both roles in this process to
 * wait on: the handler writes, the command reads.
 */
@Injectable()
export class StudyIntakeLedger {
  private readonly taken = new Map<string, StudyIntake>();
  private readonly waiting = new Map<string, (intake: StudyIntake) => void>();

  record(intake: StudyIntake): void {
    this.taken.set(intake.studyUid, intake);
    this.waiting.get(intake.studyUid)?.(intake);
  }

  /** Resolves once the study is taken; rejects after `timeoutMs`. */
  waitFor(studyUid: string, timeoutMs: number): Promise<StudyIntake> {
    const known = this.taken.get(studyUid);
    if (known) return Promise.resolve(known);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(studyUid);
        reject(new Error(`study ${studyUid} was not handled within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(studyUid, (intake) => {
        clearTimeout(timer);
        this.waiting.delete(studyUid);
        resolve(intake);
      });
    });
  }
}
