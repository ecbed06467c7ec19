import { SequenceError } from './sequence.error';

/** A ticket names a payload store this side is not configured with. */
export class UnknownPayloadStoreError extends SequenceError {
  readonly code = 'unknown-payload-store' as const;

  constructor(
    readonly store: string,
    readonly known: readonly string[],
  ) {
    super(
      `no payload store named ${JSON.stringify(store)} is configured here (known: ` +
        `${known.map((name) => JSON.stringify(name)).join(', ') || 'none'}); add it to ` +
        'claimCheck.store or claimCheck.readStores',
    );
  }
}
