import { Readable } from 'node:stream';
import { isAnyArrayBuffer } from 'node:util/types';
import { isRecordSource, type RecordSource } from '../core/payload-source';
import type { ClaimPublishOptions } from '../claim-check/claim-check.service';
import type { HeaderMap } from '../core/headers';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import { errorMessage } from '../core/errors/caught';
import { strictUtf8 } from '../core/unicode';
import { jsonText } from '../core/json-text';
import { SequenceRecord } from './sequence.record';

export const JSON_CONTENT_TYPE = 'application/json';
export const BINARY_CONTENT_TYPE = 'application/octet-stream';

/** A payload as the server reads it, whatever way it came. */
export interface IncomingPayload {
  readonly bytes: number;
  readonly contentType?: string;
  buffer(): Promise<Buffer>;
  stream(): Readable;
}

/** How `@Payload()` values are made from bytes. */
export interface DecodeLimits {
  /** Above this size a payload that is not JSON is handed over as a stream. */
  readonly streamAboveBytes: number;
  /** Largest JSON payload parsed. */
  readonly maxJsonBytes: number;
}

/** `streamAboveBytes` and `maxJsonBytes` when not given (server and client alike). */
export const DEFAULT_DECODE_LIMITS: DecodeLimits = {
  streamAboveBytes: 8 * 1024 * 1024,
  maxJsonBytes: 16 * 1024 * 1024,
};

/** True for `application/json` and `application/<anything>+json` (parameters ignored). */
export function isJson(contentType: string | undefined): boolean {
  if (!contentType) return false;
  const type = contentType.split(';', 1)[0].trim().toLowerCase();
  return type === JSON_CONTENT_TYPE || (type.startsWith('application/') && type.endsWith('+json'));
}

/**
 * The `@Payload()` value of a message: JSON parsed into a value, anything else a Buffer, or a
 * stream above `streamAboveBytes`.
 * @throws MessageRefusedError `undecodable` for JSON that is not UTF-8, does not parse, or is
 * larger than `maxJsonBytes`
 */
export async function decodePayload(
  payload: IncomingPayload,
  limits: DecodeLimits,
): Promise<unknown> {
  if (isJson(payload.contentType)) {
    if (payload.bytes > limits.maxJsonBytes) {
      throw new MessageRefusedError(
        'undecodable',
        `a ${payload.bytes}-byte JSON payload is larger than maxJsonBytes (${limits.maxJsonBytes}); ` +
          'send it with another content type to receive it as a stream',
      );
    }
    const bytes = await payload.buffer();
    const text = strictUtf8(bytes);
    if (text === undefined) {
      throw new MessageRefusedError('undecodable', 'the JSON payload is not valid UTF-8');
    }
    try {
      return JSON.parse(text) as unknown;
    } catch (error) {
      throw new MessageRefusedError(
        'undecodable',
        `the payload is not valid JSON: ${errorMessage(error)}`,
      );
    }
  }
  return payload.bytes > limits.streamAboveBytes ? payload.stream() : payload.buffer();
}

/** What a client or a reply sends: bytes, a stream or records, and how to describe them. */
export interface OutgoingPayload {
  readonly payload: Buffer | Readable | RecordSource;
  readonly contentType: string;
  readonly bytes?: number;
  readonly headers: HeaderMap;
}

/**
 * The message for `data`: a Buffer, a Readable, records (`{ records }` alone, see
 * `isRecordsOnly`) or a {@link SequenceRecord} as they are, other binary data (a typed array, a
 * `DataView`, an `ArrayBuffer`) as its bytes; anything else as JSON. A
 * `SequenceRecord` whose content type is not JSON sends a string as its UTF-8 bytes.
 * @throws TypeError when `data` cannot be written as JSON (a cycle, a BigInt) or holds what JSON
 * would send as `{}` (a Map, a Set, a Promise, an async iterable), or is a
 * `SequenceRecord` of a content type other than JSON holding neither bytes nor text
 */
export function encodePayload(data: unknown): OutgoingPayload {
  const record = data instanceof SequenceRecord ? data : undefined;
  const value: unknown = record ? record.data : data;
  const headers = { ...record?.options.headers };
  const given = record?.options.contentType;
  const binary = bytesOf(value);
  if (binary) {
    return {
      payload: binary,
      contentType: given ?? BINARY_CONTENT_TYPE,
      bytes: binary.length,
      headers,
    };
  }
  if (value instanceof Readable || isRecordsOnly(value)) {
    return {
      payload: value,
      contentType: given ?? BINARY_CONTENT_TYPE,
      bytes: record?.options.bytes,
      headers,
    };
  }
  if (given !== undefined && !isJson(given)) {
    // Labelled as something else, JSON would be wrong bytes: `"a,b\n"` for the CSV `a,b`.
    if (typeof value !== 'string') {
      throw new TypeError(
        `a SequenceRecord of content type ${given} holds ${describeValue(value)}: give it bytes, ` +
          'a stream, records or a string (sent as UTF-8), or leave the content type to JSON',
      );
    }
    const payload = Buffer.from(value, 'utf8');
    return { payload, contentType: given, bytes: payload.length, headers };
  }
  const json = jsonText(value === undefined ? null : value)!;
  const payload = Buffer.from(json, 'utf8');
  return { payload, contentType: given ?? JSON_CONTENT_TYPE, bytes: payload.length, headers };
}

function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

/**
 * The bytes of binary data, without a copy: a Buffer as it is, any other typed array or a
 * `DataView` over the bytes it views, an `ArrayBuffer` or `SharedArrayBuffer` whole. JSON would
 * send an `ArrayBuffer` as `{}` and a `Uint16Array` as an object of numbers.
 */
function bytesOf(value: unknown): Buffer | undefined {
  if (Buffer.isBuffer(value)) return value;
  if (ArrayBuffer.isView(value)) {
    return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  }
  return isAnyArrayBuffer(value) ? Buffer.from(value) : undefined;
}

/**
 * Whether `value` is records to send as bytes rather than an object to send as JSON: its
 * `records` is a non-empty array of `Uint8Array`s or another iterable or async iterable (a
 * generator, a Set, a stream; not a string nor a Buffer, whose items are not chunks), and, for a
 * plain object, its only property. A query result such as `{ records: [...], total }`, or
 * `{ records: [] }`, is JSON; an instance of a class of yours with a `records` source is records.
 */
function isRecordsOnly(value: unknown): value is RecordSource {
  if (!isRecordSource(value)) return false;
  const prototype = Object.getPrototypeOf(value) as unknown;
  const plain = prototype === Object.prototype || prototype === null;
  if (plain && Object.keys(value).length !== 1) return false;
  const { records } = value as { records: unknown };
  if (Array.isArray(records)) {
    return records.length > 0 && records.every((record) => record instanceof Uint8Array);
  }
  return (
    typeof records === 'object' &&
    records !== null &&
    !(records instanceof Uint8Array) &&
    (Symbol.iterator in records || Symbol.asyncIterator in records)
  );
}

/** What `publish` takes for an encoded payload: its description, `headers` added to its own. */
export function publishOptionsOf(
  out: OutgoingPayload,
  headers: HeaderMap,
): Pick<ClaimPublishOptions, 'contentType' | 'bytes' | 'headers'> {
  return {
    contentType: out.contentType,
    bytes: out.bytes,
    headers: { ...out.headers, ...headers },
  };
}
