/**
 * What a `catch` clause caught, which JavaScript does not promise to be an `Error`, as the
 * library passes it on.
 */

/** `error` itself when it is an Error, else an Error whose message is its text. */
export function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error(String(error));
}

/** The message of `error`, or its text when it is not an Error. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
