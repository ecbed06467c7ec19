import type { Readable } from 'node:stream';
import type { HeaderMap } from '../core/headers';
import type { CompleteSequence } from '../ports/sequence-store.port';

/**
 * A complete, verified sequence as its handler receives it. The bytes stay in the store until the
 * handler asks: `stream()` reads them in order, fragment by fragment, without ever building one
 * buffer of the whole payload; `toBuffer()` is there for payloads you know are small.
 */
export class ReassembledPayload {
  readonly channel: string;
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  /** SHA-256 of the payload, lowercase hex; verified before the handler was called. */
  readonly sha256: string;
  readonly contentType?: string;
  readonly contentEncoding?: string;
  /** The producer's own headers (those given to `send()`). */
  readonly headers: Readonly<HeaderMap>;
  readonly firstFragmentAt: Date;
  readonly lastFragmentAt: Date;

  constructor(
    sequence: CompleteSequence & { readonly sha256: string },
    private readonly open: () => Readable,
  ) {
    this.channel = sequence.scope;
    this.sequenceId = sequence.sequenceId;
    this.fragments = sequence.fragments;
    this.bytes = sequence.bytes;
    this.sha256 = sequence.sha256;
    this.contentType = sequence.contentType;
    this.contentEncoding = sequence.contentEncoding;
    this.headers = Object.freeze({ ...sequence.userHeaders });
    this.firstFragmentAt = new Date(sequence.firstFragmentAt);
    this.lastFragmentAt = new Date(sequence.lastFragmentAt);
  }

  /** The payload's bytes in order, read from the store as you consume them. Each call starts over. */
  stream(): Readable {
    return this.open();
  }

  /** The whole payload in one Buffer. */
  async toBuffer(): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of this.stream()) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks, this.bytes);
  }
}
