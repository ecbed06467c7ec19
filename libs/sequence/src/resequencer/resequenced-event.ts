import type { HeaderValue } from '../core/headers';

/** An input message as a resequencer's `key` and `seq` functions see it. */
export interface ResequencerInput {
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, unknown>>;
}

/** Headers a resequencer reads by default, and writes on every event it publishes. */
export const ResequenceHeader = {
  key: 'x-resequence-key',
  seq: 'x-resequence-seq',
} as const;

/** An event a `@Resequenced` handler receives: its key's events arrive in strictly increasing `seq`. */
export class ResequencedEvent {
  constructor(
    readonly key: string,
    readonly seq: number,
    readonly body: Buffer,
    /** The headers it arrived with (transport headers removed). */
    readonly headers: Readonly<Record<string, HeaderValue>>,
  ) {}

  /** The body as UTF-8 text. */
  text(): string {
    return this.body.toString('utf8');
  }

  /** The body parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }
}
