import { randomBytes } from 'node:crypto';
import { recycleBody } from '../body-pool';
import {
  assemblePayloadsInPlace,
  IN_PLACE_MIN_BYTES,
  payloadsAssembledInPlace,
} from './nats-payload-reads';

/** nats-core 3's parser, the real one (TypeScript's node10 resolution does not see `internal`). */
interface RealParser {
  parse(chunk: Uint8Array): void;
}
const internal = jest.requireActual<{
  Parser: new (dispatcher: { push(event: unknown): void }) => RealParser;
}>('@nats-io/nats-core/internal');

const KiB = 1024;
const MiB = 1024 * KiB;
const CRLF = '\r\n';

interface Sent {
  readonly subject: string;
  readonly headers?: string;
  readonly payload: Buffer;
}

/** `MSG`/`HMSG` protocol lines as nats-server sends them, one after the other. */
function wire(messages: readonly Sent[]): Buffer {
  const parts: Buffer[] = [];
  messages.forEach(({ subject, headers, payload }, index) => {
    if (headers === undefined) {
      parts.push(Buffer.from(`MSG ${subject} ${index + 1} ${payload.length}${CRLF}`));
      parts.push(payload, Buffer.from(CRLF));
    } else {
      const head = Buffer.from(`NATS/1.0${CRLF}${headers}${CRLF}${CRLF}`);
      parts.push(
        Buffer.from(
          `HMSG ${subject} ${index + 1} _INBOX.reply ${head.length} ${head.length + payload.length}${CRLF}`,
        ),
      );
      parts.push(head, payload, Buffer.from(CRLF));
    }
  });
  return Buffer.concat(parts);
}

/** Cuts `bytes` as socket reads would come: `sizes` in turn, repeated. */
function reads(bytes: Buffer, sizes: readonly number[]): Buffer[] {
  const chunks: Buffer[] = [];
  for (let at = 0, turn = 0; at < bytes.length; turn++) {
    const size = sizes[turn % sizes.length];
    chunks.push(bytes.subarray(at, at + size));
    at += size;
  }
  return chunks;
}

/** A connection as the client's protocol handler holds its parser, and what it dispatched. */
function connection(): {
  readonly nc: { protocol: { parser: RealParser } };
  readonly payloads: Uint8Array[];
  feed(chunks: readonly Buffer[]): void;
  reconnect(): void;
} {
  const payloads: Uint8Array[] = [];
  const dispatcher = {
    push(event: unknown): void {
      const { data } = event as { data?: Uint8Array };
      if (data !== undefined) payloads.push(data);
    },
  };
  const nc = { protocol: { parser: new internal.Parser(dispatcher) } };
  return {
    nc,
    payloads,
    // The protocol handler reads `parser` for every read, as the client's does.
    feed: (chunks) => chunks.forEach((chunk) => nc.protocol.parser.parse(chunk)),
    // The client makes a new parser when it reconnects.
    reconnect: () => {
      nc.protocol.parser = new internal.Parser(dispatcher);
    },
  };
}

const messages: Sent[] = [
  { subject: 'big', headers: 'Nats-Msg-Id: one', payload: randomBytes(MiB + 7) },
  { subject: 'small', payload: randomBytes(100) },
  { subject: 'edge', payload: randomBytes(IN_PLACE_MIN_BYTES) },
  { subject: 'under', payload: randomBytes(IN_PLACE_MIN_BYTES - 1) },
  { subject: 'middle', headers: 'A: b', payload: randomBytes(300 * KiB) },
];
const bytes = wire(messages);

/** The payload a message's dispatched data holds: its headers' bytes, then its payload. */
function expected(sent: Sent): Buffer {
  return sent.headers === undefined
    ? sent.payload
    : Buffer.concat([Buffer.from(`NATS/1.0${CRLF}${sent.headers}${CRLF}${CRLF}`), sent.payload]);
}

/** Each message's payload, dispatched in order (compared as bytes: a deep equal takes seconds). */
function expectPayloads(payloads: readonly Uint8Array[]): void {
  expect(payloads).toHaveLength(messages.length);
  expect(
    payloads.map((data, index) => Buffer.from(data).equals(expected(messages[index]))),
  ).toEqual(messages.map(() => true));
}

describe('assemblePayloadsInPlace (the nats-core 3 parser)', () => {
  it.each([
    ['64 KiB reads', [64 * KiB]],
    ['reads of odd sizes', [1, 3, 65_521, 7, 131_101, 2]],
    ['one read of everything', [bytes.length]],
  ])('dispatches every payload byte-exact from %s', (_name, sizes) => {
    const c = connection();
    expect(assemblePayloadsInPlace(c.nc)).toBe(true);
    c.feed(reads(bytes, sizes));
    expectPayloads(c.payloads);
  });

  it('gathers a large payload spanning reads in one buffer of its size, not a grown one', () => {
    const plain = connection();
    plain.feed(reads(bytes, [64 * KiB]));
    // The client's own buffer doubles as it fills: its memory ends far larger than the payload.
    expect(plain.payloads[0].buffer.byteLength).toBeGreaterThan(1.5 * MiB);

    const c = connection();
    assemblePayloadsInPlace(c.nc);
    c.feed(reads(bytes, [64 * KiB]));
    const big = c.payloads[0];
    expect(big.byteOffset).toBe(0);
    expect(big.buffer.byteLength).toBe(big.byteLength);
    // A payload under the threshold is left to the client.
    expect(recycleBody(c.payloads[3])).toBe(false);
  });

  it('writes a later payload into the memory of a released one, byte-exact', () => {
    const c = connection();
    assemblePayloadsInPlace(c.nc);
    const first = randomBytes(MiB);
    const second = randomBytes(MiB - 5);
    c.feed(reads(wire([{ subject: 'a', payload: first }]), [64 * KiB]));
    const [taken] = c.payloads;
    expect(Buffer.from(taken).equals(first)).toBe(true);
    expect(recycleBody(taken)).toBe(true);

    c.feed(reads(wire([{ subject: 'b', payload: second }]), [64 * KiB]));
    const reused = c.payloads[1];
    expect(reused.buffer).toBe(taken.buffer);
    expect(Buffer.from(reused).equals(second)).toBe(true);
  });

  it('gathers in place on the parser the client makes after a reconnect', () => {
    const c = connection();
    assemblePayloadsInPlace(c.nc);
    c.reconnect();
    c.feed(reads(bytes, [64 * KiB]));
    expectPayloads(c.payloads);
    expect(c.payloads[0].buffer.byteLength).toBe(c.payloads[0].byteLength);
  });

  it('starts over whole on the parser of a reconnect made in the middle of a payload', () => {
    const c = connection();
    assemblePayloadsInPlace(c.nc);
    // Half of the first payload, then the connection is lost; the server sends everything again.
    c.feed(reads(bytes.subarray(0, 600 * KiB), [64 * KiB]));
    expect(c.payloads).toHaveLength(0);
    c.reconnect();
    c.feed(reads(bytes, [64 * KiB]));
    expectPayloads(c.payloads);
    expect(c.payloads[0].buffer.byteLength).toBe(c.payloads[0].byteLength);
  });

  it('is idempotent: a second call does not wrap the parser again', () => {
    const c = connection();
    expect(assemblePayloadsInPlace(c.nc)).toBe(true);
    const parse = c.nc.protocol.parser.parse;
    expect(assemblePayloadsInPlace(c.nc)).toBe(true);
    expect(c.nc.protocol.parser.parse).toBe(parse);
    expect(payloadsAssembledInPlace(c.nc)).toBe(true);
  });

  it('leaves a connection of another shape as it is', () => {
    expect(assemblePayloadsInPlace(undefined)).toBe(false);
    expect(assemblePayloadsInPlace({})).toBe(false);
    expect(assemblePayloadsInPlace({ protocol: { parser: {} } })).toBe(false);
    const frozen = { protocol: Object.freeze({ parser: { parse: () => undefined } }) };
    expect(assemblePayloadsInPlace(frozen)).toBe(false);
    expect(payloadsAssembledInPlace(frozen)).toBe(false);
  });

  it('leaves a payload buffer of another shape to the client', () => {
    // A client whose growing buffer keeps its bytes under other names: nothing is replaced.
    const other = { chunks: [] as Uint8Array[] };
    const parser = {
      msgBuf: undefined as unknown,
      ma: { size: MiB },
      parse(this: { msgBuf: unknown }, chunk: Uint8Array): void {
        other.chunks.push(chunk);
        this.msgBuf = other;
      },
    };
    const nc = { protocol: { parser } };
    expect(assemblePayloadsInPlace(nc)).toBe(true);
    expect(() => nc.protocol.parser.parse(randomBytes(64 * KiB))).not.toThrow();
    expect(nc.protocol.parser.msgBuf).toBe(other);
    expect(Object.keys(other)).toEqual(['chunks']);
  });
});
