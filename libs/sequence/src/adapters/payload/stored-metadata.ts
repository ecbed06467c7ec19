import { errorMessage } from '../../core/errors/caught';
import { PayloadMetadataCorruptError } from '../../core/errors/payload-metadata-corrupt.error';
import { isStringRecord } from '../../core/objects';

/**
 * What a payload store kept as JSON text, parsed and checked by `is`; a
 * {@link PayloadMetadataCorruptError} naming the store and the payload when it is not JSON or not
 * what `is` accepts (`expected` says what that is).
 */
export function decodeStoredJson<T>(
  store: string,
  ref: string,
  text: string,
  is: (value: unknown) => value is T,
  expected: string,
): T {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new PayloadMetadataCorruptError(store, ref, errorMessage(error));
  }
  if (!is(value)) throw new PayloadMetadataCorruptError(store, ref, `not ${expected}`);
  return value;
}

/** The caller's metadata (`metadata` of `put`), kept as JSON text: an object of strings. */
export function decodeUserMetadata(
  store: string,
  ref: string,
  text: string,
): Record<string, string> {
  return decodeStoredJson(store, ref, text, isStringRecord, 'metadata: an object of strings');
}
