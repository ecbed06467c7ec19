import { Readable } from 'node:stream';
import type { HeaderMap } from '../core/headers';
import type { PublishRetryOptions } from '../sequence.options';

/**
 * Records to pack whole into fragments (record-aware mode): a record is never cut across two
 * fragments unless it alone exceeds the fragment size. The payload is their concatenation.
 */
export interface RecordSource {
  readonly records: Iterable<Uint8Array> | AsyncIterable<Uint8Array>;
}

/**
 * What `SplitterService.send` accepts:
 * - a `Buffer` / `Uint8Array` (size known: every fragment carries `x-sequence-size`);
 * - a `Readable` or `AsyncIterable` of byte chunks of unknown length (streaming mode: the size
 *   travels on the last fragment only);
 * - a {@link RecordSource} (record-aware, streaming mode).
 */
export type SplitterPayload = Uint8Array | Readable | AsyncIterable<Uint8Array> | RecordSource;

export interface SendOptions {
  /** @default a random UUID */
  sequenceId?: string;
  /** Largest fragment body. @default the module's `fragmentBytes` */
  fragmentBytes?: number;
  /** Your headers, copied onto every fragment and handed to the handler. */
  headers?: HeaderMap;
  /** Of the whole payload. */
  contentType?: string;
  /** Of the whole payload. */
  contentEncoding?: string;
  /** Overrides the module's confirm timeout and retry policy for this send. */
  publish?: PublishRetryOptions;
  /**
   * `'claim-check'`: each fragment body is parked in the Claim Check payload store and its
   * message carries only a signed ticket (`x-claim-check: 1`) with the usual fragment headers,
   * so the broker moves small messages only. The consumer resolves each ticket before storing
   * the fragment, then deletes the parked body (claimCheck.deleteAfter). @default 'broker'
   */
  via?: 'broker' | 'claim-check';
}

/** What a completed `send` reports. */
export interface SequenceReceipt {
  readonly channel: string;
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  /** SHA-256 of the whole payload, lowercase hex. */
  readonly sha256: string;
}

/** Whether a payload is a {@link RecordSource}. */
export function isRecordSource(payload: unknown): payload is RecordSource {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    'records' in payload &&
    !(payload instanceof Readable)
  );
}
