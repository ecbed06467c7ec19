import { CONTENT_TYPE_PATTERN } from '../../core/claim-ticket';
import { SequenceOptionsError } from '../../core/errors/sequence-options.error';
import type { PutOptions } from '../../ports/payload-store.port';

/**
 * Called by a store's `put` before it writes anything. Refuses a `contentType` that is not 1-255
 * printable ASCII characters (not starting with a space): no ticket can carry one (the ticket
 * format refuses it), and S3 sends it as the object's `Content-Type` header, where a line break
 * or a character beyond Latin-1 fails the request and a Latin-1 letter travels as a raw byte.
 * Every store refuses the same values, so a payload that one store keeps is kept by all.
 *
 * @throws SequenceOptionsError naming the store
 */
export function checkPutOptions(store: string, options: PutOptions): void {
  const { contentType } = options as { readonly contentType?: unknown };
  if (
    contentType !== undefined &&
    (typeof contentType !== 'string' || !CONTENT_TYPE_PATTERN.test(contentType))
  ) {
    throw new SequenceOptionsError(`put() of the ${store} payload store`, [
      `contentType must be 1-255 printable ASCII characters (a media type), got ${describe(contentType)}`,
    ]);
  }
}

/** The refused value, quoted and cut short: it may be long, and is the caller's input. */
function describe(value: unknown): string {
  if (typeof value !== 'string') return `a ${typeof value}`;
  const shown = JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}…` : value);
  return `${shown} (${value.length} characters)`;
}
