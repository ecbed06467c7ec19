/** Where the PACS router sends studies, fragment by fragment. */
export const INTAKE_CHANNEL = 'imaging.ai.intake';
/** Where the AI service publishes one JSON report per study. */
export const RESULTS_CHANNEL = 'imaging.ai.results';

/** What the AI service reports for each completed study. */
export interface StudyReport {
  sequenceId: string;
  studyUid: string;
  fragments: number;
  bytes: number;
  sha256: string;
  records: number;
  meanIntensity: number;
  status: 'ok';
}
