import { Readable } from 'node:stream';

/**
 * Records to pack whole into fragments (record-aware mode): a record is never cut across two
 * fragments unless it alone exceeds the fragment size. The payload is their concatenation.
 */
export interface RecordSource {
  readonly records: Iterable<Uint8Array> | AsyncIterable<Uint8Array>;
}

/**
 * What `SplitterService.send` accepts (and `ClaimCheckService.publish` in `mode: 'auto'`):
 * - a `Buffer` / `Uint8Array` (size known: every fragment carries `x-sequence-size`);
 * - a `Readable` or `AsyncIterable` of byte chunks of unknown length (streaming mode: the size
 *   travels on the last fragment only);
 * - a {@link RecordSource} (record-aware, streaming mode).
 */
export type SequencePayload = Uint8Array | Readable | AsyncIterable<Uint8Array> | RecordSource;

/** Whether a payload is a {@link RecordSource}. */
export function isRecordSource(payload: unknown): payload is RecordSource {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    'records' in payload &&
    !(payload instanceof Readable)
  );
}
