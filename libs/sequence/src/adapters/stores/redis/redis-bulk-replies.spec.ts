import { randomBytes } from 'node:crypto';
import fc from 'fast-check';
import { BulkReplyParser, BulkReplyProtocolError, type BulkReply } from './redis-bulk-replies';

type Outcome = { bytes: Buffer | null } | { error: string };

function collect(): { outcomes: Outcome[]; parts: Buffer[]; parser: BulkReplyParser } {
  const outcomes: Outcome[] = [];
  const parts: Buffer[] = [];
  const parser = new BulkReplyParser({
    reply: (reply: BulkReply) => {
      if (reply !== null) parts.push(...reply);
      outcomes.push({ bytes: reply === null ? null : Buffer.concat(reply) });
    },
    error: (message) => outcomes.push({ error: message }),
  });
  return { outcomes, parts, parser };
}

function bulk(bytes: Buffer): Buffer {
  return Buffer.concat([Buffer.from(`$${bytes.length}\r\n`), bytes, Buffer.from('\r\n')]);
}

/** Splits `wire` at the given cut points (any order, duplicates and out-of-range ignored). */
function split(wire: Buffer, cuts: number[]): Buffer[] {
  const points = [...new Set(cuts.map((cut) => cut % (wire.length + 1)))].sort((a, b) => a - b);
  const chunks: Buffer[] = [];
  let from = 0;
  for (const point of [...points, wire.length]) {
    if (point > from) chunks.push(Buffer.from(wire.subarray(from, point)));
    from = Math.max(from, point);
  }
  return chunks;
}

describe('BulkReplyParser', () => {
  it('hands over each reply, in order, however the socket cut the stream', () => {
    const reply = fc.oneof(
      fc.uint8Array({ maxLength: 300 }).map((bytes) => ({ bytes: Buffer.from(bytes) })),
      // Data that looks like RESP must not confuse the parser.
      fc.constant({ bytes: Buffer.from('$5\r\n-ERR\r\n\r\n') }),
      fc.constant({ bytes: null }),
      fc.stringMatching(/^[ -~]{0,40}$/).map((text) => ({ error: `ERR ${text}` })),
    );
    fc.assert(
      fc.property(
        fc.array(reply, { maxLength: 12 }),
        fc.array(fc.nat(), { maxLength: 40 }),
        (replies, cuts) => {
          const wire = Buffer.concat(
            replies.map((item) => {
              if ('error' in item) return Buffer.from(`-${item.error}\r\n`);
              return item.bytes === null ? Buffer.from('$-1\r\n') : bulk(item.bytes);
            }),
          );
          const { outcomes, parser } = collect();
          for (const chunk of split(wire, cuts)) parser.execute(chunk);
          expect(outcomes).toEqual(replies);
        },
      ),
    );
  });

  it('does not copy: the parts are views of the chunks it was given', () => {
    const data = randomBytes(200_000);
    const wire = bulk(data);
    const chunks = split(wire, [65_536, 131_072, 196_608]);
    const { outcomes, parts, parser } = collect();
    for (const chunk of chunks) parser.execute(chunk);
    expect(outcomes).toEqual([{ bytes: data }]);
    expect(parts).toHaveLength(4);
    parts.forEach((part, index) => expect(part.buffer).toBe(chunks[index].buffer));
  });

  it('hands over an empty string as no parts, and nil as null', () => {
    const replies: BulkReply[] = [];
    const errors: string[] = [];
    const parser = new BulkReplyParser({
      reply: (reply) => replies.push(reply),
      error: (message) => errors.push(message),
    });
    parser.execute(Buffer.from('$0\r\n\r\n$-1\r\n'));
    expect(replies).toEqual([[], null]);
    expect(errors).toEqual([]);
  });

  it('reads error replies as UTF-8', () => {
    const { outcomes, parser } = collect();
    parser.execute(Buffer.from('-WRONGTYPE clé\r\n'));
    expect(outcomes).toEqual([{ error: 'WRONGTYPE clé' }]);
  });

  it.each([
    ['a status reply', '+OK\r\n'],
    ['an integer reply', ':1\r\n'],
    ['an array reply', '*1\r\n'],
    ['a negative length other than nil', '$-2\r\n'],
    ['a length that is not a number', '$1e3\r\n'],
    ['a length with a leading zero', '$01\r\n'],
    ['a header without CR', '$1\n'],
    ['a bulk whose trailer is not CRLF', '$1\r\nab\r'],
    ['an endless header', `$${'1'.repeat(100)}`],
  ])('refuses %s', (_, wire) => {
    const { parser } = collect();
    expect(() => parser.execute(Buffer.from(wire))).toThrow(BulkReplyProtocolError);
  });
});
