import { IsIn, IsInt, IsOptional, Length, Matches, Min } from 'class-validator';

/** Modalities the AI service reads (DICOM codes). */
export const MODALITIES = ['CT', 'MR', 'PT', 'CR', 'DX', 'MG', 'US'] as const;

/**
 * What the sender says about a study, as JSON in its `x-study` header: checked by a
 * ValidationPipe before the handler runs, so that a study described wrongly is dead-lettered with
 * the reasons rather than analysed.
 */
export class StudyMetadataDto {
  /** A DICOM UID: digits in dot-separated components, no leading zero, at most 64 characters. */
  @Matches(/^(0|[1-9]\d*)(\.(0|[1-9]\d*))+$/, { message: 'studyUid must be a DICOM UID' })
  @Length(3, 64)
  studyUid!: string;

  @IsIn(MODALITIES)
  modality!: (typeof MODALITIES)[number];

  /** The study's size as the sender declares it; the handler checks it against what arrived. */
  @IsInt()
  @Min(1)
  bytes!: number;

  @IsOptional()
  @Length(1, 64)
  patientId?: string;
}
