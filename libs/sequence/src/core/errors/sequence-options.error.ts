import { SequenceError } from './sequence.error';

/** Module, decorator or adapter options are invalid; `problems` lists each one and how to fix it. */
export class SequenceOptionsError extends SequenceError {
  readonly code = 'invalid-options' as const;

  constructor(
    readonly where: string,
    readonly problems: readonly string[],
  ) {
    super(`invalid ${where}:\n  - ${problems.join('\n  - ')}`);
  }
}
