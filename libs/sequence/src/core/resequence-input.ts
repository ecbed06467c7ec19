/** An input message as a resequencer's `key` and `seq` functions see it. */
export interface ResequencerInput {
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, unknown>>;
}

/** Headers a resequencer reads by default, and writes on every event it publishes. */
export const ResequenceHeader = {
  key: 'x-resequence-key',
  seq: 'x-resequence-seq',
} as const;
