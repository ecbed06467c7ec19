/** Where the PACS router sends studies: inline, as a sequence of fragments, or as a ticket. */
export const INTAKE_CHANNEL = 'imaging.ai.intake';
/** Where the AI service publishes one JSON report per study. */
export const RESULTS_CHANNEL = 'imaging.ai.results';

/** How a study travelled: in one message, as a Message Sequence, or parked behind a ticket. */
export type StudyDelivery = 'inline' | 'sequence' | 'ticket';

/** What the AI service reports for each study it analysed. */
export interface StudyReport {
  /** Which delivery this reports on: see {@link deliveryIdOf}. */
  sequenceId: string;
  studyUid: string;
  via: StudyDelivery;
  fragments: number;
  bytes: number;
  sha256: string;
  records: number;
  meanIntensity: number;
  status: 'ok';
}

/**
 * The id a report carries as `sequenceId`, and the sender finds it by: the sequence's id, the
 * ticket's ref for a study parked in the payload store, or `'inline'` for one sent in a single
 * message (which has no id of its own). The sender's receipt and the receiver's payload both
 * have these fields.
 */
export function deliveryIdOf(delivery: {
  readonly sequenceId?: string;
  readonly ticket?: { readonly ref: string };
}): string {
  return delivery.sequenceId ?? delivery.ticket?.ref ?? 'inline';
}
