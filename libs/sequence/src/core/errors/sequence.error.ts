/**
 * Base class of every error this library throws. `code` is stable and machine-readable;
 * `message` says what happened, to which sequence, and what to do.
 */
export abstract class SequenceError extends Error {
  abstract readonly code: string;

  protected constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}
