import type { HeaderMap } from '../core/headers';

/** What a {@link SequenceRecord} says about its data. */
export interface SequenceRecordOptions {
  /** Headers for the message; they reach the handler's `@Ctx()` as `getHeaders()`. */
  readonly headers?: HeaderMap;
  /** The payload's content type. @default `application/json` for objects, else `application/octet-stream` */
  readonly contentType?: string;
  /**
   * The size of a streamed payload, when known: lets it go as a Message Sequence (a stream of
   * unknown size goes behind a claim ticket).
   */
  readonly bytes?: number;
}

/**
 * Data for `SequenceClient.emit()` / `send()` with headers, a content type or a known size, as
 * Nest's record builders do for its own transports.
 *
 * @example
 * client.emit('imaging.ai.intake', new SequenceRecord(createReadStream(path), {
 *   bytes: size, contentType: 'application/dicom', headers: { 'x-study': JSON.stringify(meta) },
 * }));
 */
export class SequenceRecord<T = unknown> {
  constructor(
    readonly data: T,
    readonly options: SequenceRecordOptions = {},
  ) {}
}
