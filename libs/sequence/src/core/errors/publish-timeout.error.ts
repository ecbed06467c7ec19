import { SequenceError } from './sequence.error';

/** The transport did not confirm a publish within `confirmTimeoutMs`. */
export class PublishTimeoutError extends SequenceError {
  readonly code = 'publish-timeout' as const;

  constructor(
    readonly channel: string,
    readonly timeoutMs: number,
  ) {
    super(`publish to ${channel} was not confirmed within ${timeoutMs} ms`);
  }
}
