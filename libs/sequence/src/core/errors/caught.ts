/**
 * What a `catch` clause caught, which JavaScript does not promise to be an `Error`, as the
 * library passes it on.
 */

/** `error` itself when it is an Error, else an Error whose message is its text. */
export function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(textOf(error));
}

/** The message of `error`, or its text when it is not an Error. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : textOf(error);
}

/**
 * `value` as `String()` gives it, also for what `String()` throws on (an object without a
 * prototype, or whose `toString` returns no text, as a thrown value may be): then its JSON, or
 * its type tag. Describing an error must not fail in turn.
 */
export function textOf(value: unknown): string {
  try {
    return String(value);
  } catch {
    try {
      return JSON.stringify(value) ?? Object.prototype.toString.call(value);
    } catch {
      return Object.prototype.toString.call(value);
    }
  }
}
