/**
 * The reply to one bulk-string command (GET, GETRANGE): its bytes as views of the socket's chunks,
 * in order (no part is empty; none at all for an empty string), or null for a nil reply.
 */
export type BulkReply = readonly Buffer[] | null;

/** Where the parser sends each reply, in the order the commands were written. */
export interface BulkReplySink {
  reply(reply: BulkReply): void;
  /** An error reply (`-ERR …`), as Redis sent it. */
  error(message: string): void;
}

/** The stream of replies did not look like replies to bulk-string commands. */
export class BulkReplyProtocolError extends Error {
  override readonly name = 'BulkReplyProtocolError';
}

const CR = 13;
const LF = 10;
/** The longest header line a bulk reply needs (`$` and a length of up to 512 MiB, CRLF). */
const MAX_HEADER_BYTES = 64;

/**
 * Parses a connection's RESP2 replies to bulk-string commands without copying their bytes: a
 * reply's parts are `subarray`s of the chunks the socket delivered, handed over once the reply is
 * whole. ioredis's parser, by contrast, joins a large reply's chunks into one new Buffer, so every
 * byte read back is allocated twice, and most of a streaming consumer's garbage is those copies.
 *
 * Only what such commands answer is understood: `$<n>` bulk strings, `$-1` nil, `-` errors.
 * Anything else is a {@link BulkReplyProtocolError} thrown from `execute`, after which the
 * connection is unusable.
 */
export class BulkReplyParser {
  /** The header line read so far, when it spans chunks. */
  private header = '';
  /** Bytes of the current bulk still to come, its CRLF included; -1 between replies. */
  private left = -1;
  /** Bytes of the current bulk without its CRLF, to tell data from the trailer. */
  private length = 0;
  private parts: Buffer[] = [];

  constructor(private readonly sink: BulkReplySink) {}

  execute(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.left < 0) {
        at = this.readHeader(chunk, at);
        continue;
      }
      const take = Math.min(this.left, chunk.length - at);
      // The bulk's data ends `2` bytes before its end: what is past that is its CRLF.
      const dataLeft = Math.max(0, this.left - 2);
      const data = Math.min(take, dataLeft);
      if (data > 0) this.parts.push(chunk.subarray(at, at + data));
      for (let index = data; index < take; index++) {
        const expected = this.left - index === 2 ? CR : LF;
        if (chunk[at + index] !== expected) {
          throw new BulkReplyProtocolError(
            `a bulk reply of ${this.length} bytes does not end with CRLF`,
          );
        }
      }
      at += take;
      this.left -= take;
      if (this.left === 0) {
        this.left = -1;
        const parts = this.parts;
        this.parts = [];
        this.sink.reply(parts);
      }
    }
  }

  /** Reads (the rest of) a header line from `at`; returns where parsing goes on. */
  private readHeader(chunk: Buffer, at: number): number {
    const end = chunk.indexOf(LF, at);
    const stop = end < 0 ? chunk.length : end + 1;
    this.header += chunk.toString('latin1', at, stop);
    if (end < 0) {
      if (this.header.length > MAX_HEADER_BYTES && this.header[0] !== '-') {
        throw new BulkReplyProtocolError(`a reply header is longer than ${MAX_HEADER_BYTES} bytes`);
      }
      return stop;
    }
    const line = this.header;
    this.header = '';
    if (!line.endsWith('\r\n'))
      throw new BulkReplyProtocolError('a reply line does not end with CRLF');
    const body = line.slice(1, -2);
    switch (line[0]) {
      case '-':
        this.sink.error(Buffer.from(body, 'latin1').toString('utf8'));
        return stop;
      case '$': {
        if (body === '-1') {
          this.sink.reply(null);
          return stop;
        }
        const length = /^(0|[1-9]\d{0,15})$/.test(body) ? Number(body) : NaN;
        if (!Number.isSafeInteger(length)) {
          throw new BulkReplyProtocolError(`a bulk reply has the length ${JSON.stringify(body)}`);
        }
        this.length = length;
        this.left = length + 2;
        return stop;
      }
      default:
        throw new BulkReplyProtocolError(
          `a reply of type ${JSON.stringify(line[0])} where a bulk string was expected`,
        );
    }
  }
}
