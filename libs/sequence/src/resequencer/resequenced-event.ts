import type { HeaderValue } from '../core/headers';

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
