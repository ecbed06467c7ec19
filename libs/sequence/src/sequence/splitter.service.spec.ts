import type { PublishPolicy } from '../options/module-options';
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { crc32 } from 'node:zlib';
import {
  InMemoryTransport,
  MessageTooLargeError,
  PublishTimeoutError,
  SequenceOptionsError,
  SequencePublishError,
  SequenceSourceError,
  SplitterService,
  type InboundMessage,
  type SendOptions,
} from 'nest-sequence';
import { FaultInjectingTransport, bytes, eventually } from '../../test/support/sequence-test-app';
import { bootSplitter, closeSplitters } from '../../test/support/splitter-app';
import { exposedGc } from '../../test/support/garbage';

const KiB = 1024;
const MiB = 1024 * KiB;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

afterEach(closeSplitters);

function sha256(payload: Buffer): string {
  return createHash('sha256').update(payload).digest('hex');
}

function concat(fragments: InboundMessage[]): Buffer {
  return Buffer.concat(fragments.map((fragment) => fragment.body));
}

function header(fragment: InboundMessage, name: string): unknown {
  return fragment.headers[name];
}

/** An async source of `payload` in chunks of `chunkBytes`, like a file read stream. */
async function* chunksOf(payload: Buffer, chunkBytes: number): AsyncGenerator<Buffer> {
  for (let offset = 0; offset < payload.length; offset += chunkBytes) {
    yield payload.subarray(offset, offset + chunkBytes);
  }
}

/** A promise the test settles by hand. */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** Lets every pending promise chain and `setImmediate` callback run. */
function settle(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 5));
}

describe('SplitterService', () => {
  let transport: InMemoryTransport;
  let splitter: SplitterService;

  beforeEach(async () => {
    transport = new InMemoryTransport();
    splitter = await bootSplitter({ transport });
  });

  describe('sending a Buffer', () => {
    it('writes the wire contract headers exactly, fragment by fragment', async () => {
      const payload = Buffer.from('0123456789');
      await splitter.send('scans', payload, {
        sequenceId: 'study-1',
        fragmentBytes: 4,
        headers: { tenant: 'acme', priority: 3, urgent: true },
        contentType: 'application/dicom',
        contentEncoding: 'identity',
      });

      const fragments = transport.take('scans');
      const common = {
        tenant: 'acme',
        priority: 3,
        urgent: true,
        'x-sequence-version': 1,
        'x-sequence-id': 'study-1',
        'x-sequence-size': 3,
        'x-sequence-bytes': 10,
        'content-type': 'application/dicom',
        'content-encoding': 'identity',
      };
      expect(fragments.map((f) => f.body.toString())).toEqual(['0123', '4567', '89']);
      expect(fragments.map((f) => f.headers)).toEqual([
        { ...common, 'x-sequence-position': 1, 'x-fragment-crc32': crc32('0123') },
        { ...common, 'x-sequence-position': 2, 'x-fragment-crc32': crc32('4567') },
        {
          ...common,
          'x-sequence-position': 3,
          'x-sequence-last': true,
          'x-fragment-crc32': crc32('89'),
          'x-sequence-sha256': sha256(payload),
        },
      ]);
    });

    it('cuts n bytes into ceil(n / fragmentBytes) fragments, none larger than fragmentBytes', async () => {
      const payload = bytes(100_001);
      await splitter.send('scans', payload, { fragmentBytes: 7_000 });

      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(Math.ceil(100_001 / 7_000));
      for (const fragment of fragments) expect(fragment.body.length).toBeLessThanOrEqual(7_000);
      expect(concat(fragments).equals(payload)).toBe(true);
    });

    it('numbers the fragments 1..N and declares size N and the byte count on every one', async () => {
      await splitter.send('scans', bytes(50_000), { fragmentBytes: 6_000 });

      const fragments = transport.take('scans');
      expect(fragments.map((f) => header(f, 'x-sequence-position'))).toEqual([
        1, 2, 3, 4, 5, 6, 7, 8, 9,
      ]);
      for (const fragment of fragments) {
        expect(header(fragment, 'x-sequence-version')).toBe(1);
        expect(header(fragment, 'x-sequence-size')).toBe(9);
        expect(header(fragment, 'x-sequence-bytes')).toBe(50_000);
      }
    });

    it('marks only the last fragment as last and gives it alone the SHA-256 of the payload', async () => {
      const payload = bytes(25_000);
      await splitter.send('scans', payload, { fragmentBytes: 10_000 });

      const [first, second, last] = transport.take('scans');
      for (const fragment of [first, second]) {
        expect(fragment.headers).not.toHaveProperty('x-sequence-last');
        expect(fragment.headers).not.toHaveProperty('x-sequence-sha256');
      }
      expect(header(last, 'x-sequence-last')).toBe(true);
      expect(header(last, 'x-sequence-sha256')).toBe(sha256(payload));
    });

    it('gives each fragment the CRC-32 of its own body', async () => {
      await splitter.send('scans', bytes(40_000), { fragmentBytes: 9_000 });

      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(5);
      for (const fragment of fragments) {
        expect(header(fragment, 'x-fragment-crc32')).toBe(crc32(fragment.body));
      }
    });

    it('copies user headers, content-type and content-encoding onto every fragment', async () => {
      await splitter.send('scans', bytes(30_000), {
        fragmentBytes: 8_000,
        headers: { 'study-uid': '1.2.3', modality: 'CT', slices: 512, anonymised: false },
        contentType: 'application/octet-stream',
        contentEncoding: 'gzip',
      });

      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(4);
      for (const fragment of fragments) {
        expect(fragment.headers).toMatchObject({
          'study-uid': '1.2.3',
          modality: 'CT',
          slices: 512,
          anonymised: false,
          'content-type': 'application/octet-stream',
          'content-encoding': 'gzip',
        });
      }
    });

    it('resolves to a receipt naming the channel, sequence id, fragments, bytes and SHA-256', async () => {
      const payload = bytes(20_000);
      const receipt = await splitter.send('scans', payload, { fragmentBytes: 6_000 });

      const fragments = transport.take('scans');
      expect(receipt).toEqual({
        channel: 'scans',
        sequenceId: header(fragments[0], 'x-sequence-id'),
        fragments: 4,
        bytes: 20_000,
        sha256: sha256(payload),
      });
    });

    it('gives every fragment the sequenceId it was asked to use', async () => {
      const receipt = await splitter.send('scans', bytes(5_000), {
        sequenceId: 'CT.2026-11-02:study_7',
        fragmentBytes: 2_000,
      });

      expect(receipt.sequenceId).toBe('CT.2026-11-02:study_7');
      for (const fragment of transport.take('scans')) {
        expect(header(fragment, 'x-sequence-id')).toBe('CT.2026-11-02:study_7');
      }
    });

    it('gives each send a fresh UUID when no sequenceId is given', async () => {
      const first = await splitter.send('scans', bytes(10));
      const second = await splitter.send('scans', bytes(10));

      expect(first.sequenceId).toMatch(UUID);
      expect(second.sequenceId).toMatch(UUID);
      expect(second.sequenceId).not.toBe(first.sequenceId);
    });

    it('sends an empty Buffer as a valid sequence of one empty fragment', async () => {
      const receipt = await splitter.send('scans', Buffer.alloc(0), { fragmentBytes: 1_000 });

      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(1);
      expect(fragments[0].body.length).toBe(0);
      expect(fragments[0].headers).toMatchObject({
        'x-sequence-position': 1,
        'x-sequence-size': 1,
        'x-sequence-last': true,
        'x-sequence-bytes': 0,
        'x-fragment-crc32': crc32(Buffer.alloc(0)),
        'x-sequence-sha256': sha256(Buffer.alloc(0)),
      });
      expect(receipt).toMatchObject({ fragments: 1, bytes: 0, sha256: sha256(Buffer.alloc(0)) });
    });

    it('sends a payload smaller than one fragment as a valid sequence of one', async () => {
      const payload = bytes(999);
      const receipt = await splitter.send('scans', payload, { fragmentBytes: 1_000 });

      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(1);
      expect(fragments[0].body.equals(payload)).toBe(true);
      expect(fragments[0].headers).toMatchObject({
        'x-sequence-position': 1,
        'x-sequence-size': 1,
        'x-sequence-last': true,
        'x-sequence-bytes': 999,
        'x-sequence-sha256': sha256(payload),
      });
      expect(receipt.fragments).toBe(1);
    });

    it.each([
      ['a Uint16Array', new Uint16Array([1, 2, 3])],
      ['a Float64Array', new Float64Array([1.5])],
      ['a DataView', new DataView(new ArrayBuffer(6))],
    ])('sends the bytes of %s, as of any typed array', async (_, view) => {
      const expected = Buffer.from(view.buffer, view.byteOffset, view.byteLength);
      // Typed as Uint8Array; a JavaScript caller may pass any view.
      const receipt = await splitter.send('scans', view as unknown as Uint8Array, {
        fragmentBytes: 4,
      });

      expect(receipt).toMatchObject({ bytes: view.byteLength, sha256: sha256(expected) });
      expect(concat(transport.peek('scans')).equals(expected)).toBe(true);
    });

    it('sends the viewed bytes of a Uint8Array that is a window on a larger buffer', async () => {
      const backing = bytes(10_000);
      const view = new Uint8Array(backing.buffer, backing.byteOffset + 1_000, 3_000);
      const receipt = await splitter.send('scans', view, { fragmentBytes: 1_024 });

      const expected = backing.subarray(1_000, 4_000);
      expect(concat(transport.take('scans')).equals(expected)).toBe(true);
      expect(receipt).toMatchObject({ fragments: 3, bytes: 3_000, sha256: sha256(expected) });
    });
  });

  describe('sending a stream of unknown length', () => {
    it('declares size, bytes and SHA-256 only on the last fragment, which is marked last', async () => {
      const payload = bytes(10_500);
      await splitter.send('exports', Readable.from(chunksOf(payload, 1_500)), {
        fragmentBytes: 4_000,
      });

      const fragments = transport.take('exports');
      expect(fragments).toHaveLength(3);
      for (const fragment of fragments.slice(0, -1)) {
        expect(fragment.headers).not.toHaveProperty('x-sequence-size');
        expect(fragment.headers).not.toHaveProperty('x-sequence-bytes');
        expect(fragment.headers).not.toHaveProperty('x-sequence-sha256');
        expect(fragment.headers).not.toHaveProperty('x-sequence-last');
      }
      expect(fragments[2].headers).toMatchObject({
        'x-sequence-position': 3,
        'x-sequence-size': 3,
        'x-sequence-last': true,
        'x-sequence-bytes': 10_500,
        'x-sequence-sha256': sha256(payload),
      });
    });

    it('sends a Readable whose fragment bodies concatenate to the input', async () => {
      const payload = bytes(64_321);
      const receipt = await splitter.send('exports', Readable.from(chunksOf(payload, 3_333)), {
        fragmentBytes: 8_192,
      });

      const fragments = transport.take('exports');
      expect(concat(fragments).equals(payload)).toBe(true);
      expect(fragments.map((f) => f.body.length)).toEqual([
        ...Array<number>(7).fill(8_192),
        64_321 - 7 * 8_192,
      ]);
      expect(receipt).toMatchObject({ fragments: 8, bytes: 64_321, sha256: sha256(payload) });
    });

    it('sends an AsyncIterable<Buffer> of irregular chunks whose bodies concatenate to the input', async () => {
      const payload = bytes(20_000);
      async function* irregular(): AsyncGenerator<Buffer> {
        const sizes = [1, 4_999, 7, 10_000, 2_500, 2_493];
        let offset = 0;
        for (const size of sizes) {
          yield payload.subarray(offset, offset + size);
          offset += size;
        }
      }
      const receipt = await splitter.send('exports', irregular(), { fragmentBytes: 6_000 });

      const fragments = transport.take('exports');
      expect(fragments.map((f) => f.body.length)).toEqual([6_000, 6_000, 6_000, 2_000]);
      expect(concat(fragments).equals(payload)).toBe(true);
      for (const fragment of fragments) {
        expect(header(fragment, 'x-fragment-crc32')).toBe(crc32(fragment.body));
      }
      expect(receipt).toMatchObject({ fragments: 4, bytes: 20_000, sha256: sha256(payload) });
    });

    it('sends an empty stream as one empty fragment carrying size 1, bytes 0 and the SHA-256', async () => {
      const receipt = await splitter.send('exports', Readable.from([]), { fragmentBytes: 100 });

      const fragments = transport.take('exports');
      expect(fragments).toHaveLength(1);
      expect(fragments[0].body.length).toBe(0);
      expect(fragments[0].headers).toMatchObject({
        'x-sequence-position': 1,
        'x-sequence-size': 1,
        'x-sequence-last': true,
        'x-sequence-bytes': 0,
        'x-sequence-sha256': sha256(Buffer.alloc(0)),
      });
      expect(receipt).toMatchObject({ fragments: 1, bytes: 0 });
    });

    it('encodes the string chunks of a stream with an encoding as UTF-8', async () => {
      const text = 'dose 5 µSv — ok\n'.repeat(20);
      await splitter.send('exports', Readable.from([text.slice(0, 100), text.slice(100)]), {
        fragmentBytes: 64,
      });

      expect(concat(transport.take('exports')).toString('utf8')).toBe(text);
    });
  });

  it('sends every fragment of a stream with the headers it was given, whatever the caller changes later', async () => {
    const headers = { tenant: 'acme' };
    async function* source(): AsyncGenerator<Buffer> {
      yield Buffer.alloc(4, 1);
      yield Buffer.alloc(4, 2);
      headers.tenant = 'other'; // the caller reuses its options object meanwhile
      yield Buffer.alloc(4, 3);
      yield Buffer.alloc(4, 4);
    }
    await splitter.send('scans', source(), { fragmentBytes: 4, headers });

    expect(transport.peek('scans').map((fragment) => header(fragment, 'tenant'))).toEqual([
      'acme',
      'acme',
      'acme',
      'acme',
    ]);
  });

  describe('sending records', () => {
    /** Records of the given sizes, each filled with its own index so a cut shows. */
    function recordsOf(sizes: number[]): Buffer[] {
      return sizes.map((size, index) => Buffer.alloc(size, index + 1));
    }

    /** Offsets where one record ends and the next begins, and the payload's end. */
    function boundaries(records: Buffer[]): Set<number> {
      const ends = new Set<number>([0]);
      let offset = 0;
      for (const record of records) ends.add((offset += record.length));
      return ends;
    }

    it('packs records from a sync iterable without cutting any', async () => {
      const records = recordsOf([300, 450, 120, 999, 1, 700, 640, 200, 333, 1_000, 5]);
      await splitter.send('imports', { records: records.values() }, { fragmentBytes: 1_000 });

      const fragments = transport.take('imports');
      const ends = boundaries(records);
      let offset = 0;
      for (const fragment of fragments) {
        expect(fragment.body.length).toBeLessThanOrEqual(1_000);
        expect(ends.has(offset)).toBe(true);
        offset += fragment.body.length;
        expect(ends.has(offset)).toBe(true);
      }
      expect(concat(fragments).equals(Buffer.concat(records))).toBe(true);
    });

    it('packs records from an async iterable without cutting any', async () => {
      const records = recordsOf([10, 20, 30, 40, 50, 60, 70, 80, 90, 100]);
      async function* source(): AsyncGenerator<Buffer> {
        for (const record of records) yield record;
      }
      await splitter.send('imports', { records: source() }, { fragmentBytes: 100 });

      const fragments = transport.take('imports');
      expect(fragments.map((f) => f.body.length)).toEqual([100, 50, 60, 70, 80, 90, 100]);
      expect(concat(fragments).equals(Buffer.concat(records))).toBe(true);
    });

    it('cuts a record larger than fragmentBytes at fragmentBytes, starting on a fresh fragment', async () => {
      const [small, large, tail] = recordsOf([4, 25, 3]);
      await splitter.send('imports', { records: [small, large, tail] }, { fragmentBytes: 10 });

      const bodies = transport.take('imports').map((f) => f.body);
      expect(bodies).toEqual([
        small,
        large.subarray(0, 10),
        large.subarray(10, 20),
        Buffer.concat([large.subarray(20), tail]),
      ]);
    });

    it('sends records in streaming mode: size, bytes and SHA-256 on the last fragment only', async () => {
      const records = recordsOf([60, 60, 60]);
      const receipt = await splitter.send('imports', { records }, { fragmentBytes: 100 });

      const [first, second, last] = transport.take('imports');
      for (const fragment of [first, second]) {
        expect(fragment.headers).not.toHaveProperty('x-sequence-size');
        expect(fragment.headers).not.toHaveProperty('x-sequence-bytes');
      }
      expect(last.headers).toMatchObject({
        'x-sequence-size': 3,
        'x-sequence-last': true,
        'x-sequence-bytes': 180,
        'x-sequence-sha256': sha256(Buffer.concat(records)),
      });
      expect(receipt).toMatchObject({ fragments: 3, bytes: 180 });
    });
  });

  describe('fragment size', () => {
    it("defaults fragmentBytes to the transport's maxMessageBytes minus headerAllowanceBytes", async () => {
      const small = new InMemoryTransport({ maxMessageBytes: 20_000 });
      const smallSplitter = await bootSplitter({ transport: small });

      await smallSplitter.send('scans', bytes(10_000));

      // 20,000 - 16,384 (the default header allowance) = 3,616 bytes per fragment.
      expect(small.take('scans').map((f) => f.body.length)).toEqual([3_616, 3_616, 2_768]);
    });

    it('derives the default from a custom headerAllowanceBytes', async () => {
      const small = new InMemoryTransport({ maxMessageBytes: 20_000 });
      const smallSplitter = await bootSplitter({
        transport: small,
        tuning: { headerAllowanceBytes: 4_000 },
      });

      await smallSplitter.send('scans', bytes(40_000));

      expect(small.take('scans').map((f) => f.body.length)).toEqual([16_000, 16_000, 8_000]);
    });

    it("uses the module's fragmentBytes unless a send overrides it", async () => {
      const moduleSized = await bootSplitter({
        transport,
        sequence: { fragmentBytes: 3_000 },
      });

      await moduleSized.send('scans', bytes(9_000));
      await moduleSized.send('other', bytes(9_000), { fragmentBytes: 4_500 });

      expect(transport.take('scans')).toHaveLength(3);
      expect(transport.take('other')).toHaveLength(2);
    });
  });

  describe('validation', () => {
    async function expectRefused(
      send: Promise<unknown>,
      problem: string | RegExp,
      channel = 'scans',
    ): Promise<void> {
      const error = await send.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).message).toMatch(problem);
      expect(transport.depth(channel)).toBe(0);
    }

    it.each([
      ['contains a space', 'study 1'],
      ['contains a slash', 'a/b'],
      ['is empty', ''],
      ['is longer than 128 characters', 'x'.repeat(129)],
    ])('refuses a sequenceId that %s', async (_, sequenceId) => {
      await expectRefused(
        splitter.send('scans', bytes(10), { sequenceId }),
        'must be 1-128 characters of [A-Za-z0-9._:-]',
      );
    });

    it.each([
      'x-sequence-id',
      'x-sequence-position',
      'x-sequence-size',
      'x-sequence-last',
      'x-sequence-sha256',
      'x-sequence-bytes',
      'x-sequence-version',
      'x-fragment-crc32',
      'x-claim-check', // a receiver would take every fragment's body for a ticket
    ])('refuses a user header named %s, which belongs to the wire contract', async (name) => {
      await expectRefused(
        splitter.send('scans', bytes(10), { headers: { [name]: 'mine' } }),
        `header ${name} belongs to the wire contract; rename yours`,
      );
    });

    it.each([
      ['content-type', 42],
      ['content-type', true],
      ['content-type', 'text/plain; name=résumé'],
      ['content-encoding', ' gzip'],
    ])(
      'refuses a %s user header %j, which its consumers would refuse on every fragment',
      async (name, value) => {
        await expectRefused(
          splitter.send('scans', bytes(10), { headers: { [name]: value } }),
          `header ${name} must be 1-255 printable ASCII characters`,
        );
      },
    );

    it('refuses options that are not an object, and closes the stream it was given', async () => {
      const source = Readable.from([bytes(10)]);
      await expectRefused(
        splitter.send('scans', source, null as unknown as SendOptions),
        'options must be an object, got null',
      );
      expect(source.destroyed).toBe(true);
    });

    it('closes a stream it refuses to send (a file handle is not left open)', async () => {
      const source = Readable.from([bytes(10)]);
      await expectRefused(splitter.send('scans', source, { fragmentBytes: 0 }), /fragmentBytes/);
      expect(source.destroyed).toBe(true);
    });

    it.each(['x-requeue-count', 'x-death-reason', 'x-delivery-count', 'x-first-death-queue'])(
      'refuses a user header named %s, which transports set on each delivery',
      async (name) => {
        await expectRefused(
          splitter.send('scans', bytes(10), { headers: { [name]: 1 } }),
          `header ${name} is set by the broker or transport on each delivery; do not send it`,
        );
      },
    );

    it.each([
      ['an object', { nested: true }],
      ['an array', ['a']],
      ['null', null],
      ['a Buffer', Buffer.from('x')],
    ])('refuses a header value that is %s', async (_, value) => {
      const headers = { tenant: value } as unknown as SendOptions['headers'];
      await expectRefused(
        splitter.send('scans', bytes(10), { headers }),
        'header tenant must be a string, number or boolean',
      );
    });

    it.each([
      [Number.NaN, 'header tenant must be a finite number, got NaN'],
      [Infinity, 'header tenant must be a finite number, got Infinity'],
    ])(
      'refuses a header value of %s, which neither AMQP nor JSON carries',
      async (value, problem) => {
        await expectRefused(
          splitter.send('scans', bytes(10), { headers: { tenant: value } }),
          problem,
        );
      },
    );

    it('refuses a header name over 255 bytes (AMQP keeps a name in a short string)', async () => {
      const name = 'h'.repeat(256);
      await expectRefused(
        splitter.send('scans', bytes(10), { headers: { [name]: 1 } }),
        `header name ${name.slice(0, 40)}… is over 255 bytes (AMQP's limit)`,
      );
    });

    it("refuses a fragmentBytes that does not fit the transport's maxMessageBytes", async () => {
      const small = new InMemoryTransport({ maxMessageBytes: 20_000 });
      const smallSplitter = await bootSplitter({ transport: small });

      const error = await smallSplitter
        .send('scans', bytes(10), { fragmentBytes: 5_000 })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).message).toContain('use at most 3616');
      expect(small.depth('scans')).toBe(0);
    });

    it.each([
      ['a Buffer', () => bytes(2 * 3_616)],
      ['a stream', () => Readable.from([bytes(2 * 3_616)])],
    ])(
      'refuses, before sending, headers within maxHeaderBytes that a full last fragment of %s could not carry within maxMessageBytes',
      async (_, payload) => {
        // fragmentBytes is derived: 20,000 − the 16 KiB header allowance = 3,616. The user headers
        // (about 16,160 bytes, within the 16 KiB maxHeaderBytes) and the contract's own leave a
        // full fragment room, but not a full last one, which adds the SHA-256 and the last flag.
        const small = new InMemoryTransport({ maxMessageBytes: 20_000 });
        const smallSplitter = await bootSplitter({ transport: small });

        const error = await smallSplitter
          .send('scans', payload(), { headers: { note: 'x'.repeat(16_150) } })
          .catch((e: unknown) => e);

        expect({ error, queued: small.depth('scans') }).toEqual({
          error: expect.any(SequenceOptionsError),
          queued: 0,
        });
        expect((error as SequenceOptionsError).message).toContain('maxMessageBytes (20000)');
      },
    );

    it("refuses a fragmentBytes above the module's maxFragmentBytes, which its consumers would dead-letter", async () => {
      const bounded = await bootSplitter({
        transport: new InMemoryTransport(),
        sequence: { fragmentBytes: 1 * MiB, maxFragmentBytes: 1 * MiB },
      });

      const error = await bounded
        .send('scans', bytes(10), { fragmentBytes: 4 * MiB })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).message).toContain(
        `exceeds the module's sequence.maxFragmentBytes (${MiB})`,
      );
    });

    it.each([
      ['maxSequenceBytes', bytes(1_001), {}, 'sequence.maxSequenceBytes (1000)'],
      ['maxFragments', bytes(1_000), { fragmentBytes: 333 }, 'sequence.maxFragments (3)'],
    ])(
      "refuses, before sending, a Buffer over the module's %s, which its consumers would dead-letter",
      async (_, payload, options, limit) => {
        const small = new InMemoryTransport({ maxMessageBytes: 20_000 });
        const bounded = await bootSplitter({
          transport: small,
          sequence: { maxSequenceBytes: 1_000, maxFragments: 3 },
        });

        const error = await bounded.send('scans', payload, options).catch((e: unknown) => e);

        expect({ error, queued: small.depth('scans') }).toEqual({
          error: expect.any(SequenceOptionsError),
          queued: 0,
        });
        expect((error as SequenceOptionsError).message).toContain(limit);
      },
    );

    it.each([0, -1, 1.5, Number.NaN])('refuses fragmentBytes %p', async (fragmentBytes) => {
      await expectRefused(
        splitter.send('scans', bytes(10), { fragmentBytes }),
        'fragmentBytes must be a positive integer',
      );
    });

    it('refuses an empty channel', async () => {
      await expectRefused(splitter.send('', bytes(10)), 'channel must be a non-empty string', '');
    });

    it.each<[PublishPolicy, string]>([
      [{ retry: { attempts: 0 } }, 'publish.retry.attempts must be an integer >= 1, got 0'],
      [{ retry: { attempts: 2.5 } }, 'publish.retry.attempts must be an integer >= 1, got 2.5'],
      [{ confirmTimeoutMs: 0 }, 'publish.confirmTimeoutMs must be an integer >= 1, got 0'],
      [{ retry: { baseDelayMs: -1 } }, 'publish.retry.baseDelayMs must be an integer >= 0, got -1'],
      [{ retry: { maxDelayMs: -5 } }, 'publish.retry.maxDelayMs must be an integer >= 0, got -5'],
      [{ inFlight: 0 }, 'publish.inFlight must be an integer >= 1, got 0'],
    ])('refuses the publish override %p', async (publish, problem) => {
      await expectRefused(splitter.send('scans', bytes(10), { publish }), problem);
    });

    it('lists every problem of a send at once', async () => {
      const error = (await splitter
        .send('scans', bytes(10), { sequenceId: 'bad id', publish: { inFlight: 0 } })
        .catch((e: unknown) => e)) as SequenceOptionsError;

      expect(error.problems).toHaveLength(2);
      expect(error.where).toBe('send() to scans');
    });

    it("falls back to the module's attempts when a send passes attempts: undefined", async () => {
      const failing = new FaultInjectingTransport(new InMemoryTransport());
      failing.beforePublish = () => {
        throw new Error('nack');
      };
      const strict = await bootSplitter({
        transport: failing,
        publish: { retry: { attempts: 3, baseDelayMs: 0 } },
      });

      const error = await strict
        .send('scans', bytes(10), {
          publish: { retry: { attempts: undefined } },
        })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequencePublishError);
      expect((error as SequencePublishError).attempts).toBe(3);
      expect(failing.attempts).toHaveLength(3);
    });
  });

  describe('a source that fails midway', () => {
    it('rejects with a SequenceSourceError naming the sequence and the fragments sent, the cause attached', async () => {
      const cause = new Error('ECONNRESET while reading the study');
      async function* failing(): AsyncGenerator<Buffer> {
        yield bytes(1_000, 1);
        yield bytes(1_000, 2);
        throw cause;
      }

      const error = await splitter
        .send('scans', failing(), { fragmentBytes: 1_000, sequenceId: 'study-7' })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequenceSourceError);
      expect(error).toMatchObject({
        code: 'source-failed',
        channel: 'scans',
        sequenceId: 'study-7',
        cause,
      });
      expect((error as SequenceSourceError).fragmentsSent).toBe(transport.depth('scans'));
      expect((error as Error).message).toContain('study-7');
    });

    it('rejects with a SequenceSourceError when the source yields something that is not bytes', async () => {
      async function* odd(): AsyncGenerator<unknown> {
        yield bytes(10, 1);
        yield { not: 'bytes' };
      }

      const error = await splitter
        .send('scans', odd() as AsyncIterable<Uint8Array>, { sequenceId: 'odd-1' })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequenceSourceError);
      expect((error as SequenceSourceError).cause).toBeInstanceOf(TypeError);
    });
  });

  describe('a send aborted through its signal', () => {
    it('reads no further, destroys the stream and rejects with the reason; no last fragment', async () => {
      let read = 0;
      const source = new Readable({
        read() {
          setTimeout(() => {
            read++;
            if (!source.destroyed) this.push(bytes(1_000, read));
          }, 1);
        },
      });
      const controller = new AbortController();
      const reason = new Error('nobody waits for it');
      const sending = splitter.send('scans', source, { fragmentBytes: 1_000 }, controller.signal);
      await eventually(() => transport.depth('scans') >= 3, 'fragments sent');
      controller.abort(reason);

      await expect(sending).rejects.toBe(reason);
      expect(source.destroyed).toBe(true);
      const readAtAbort = read;
      const sent = transport.depth('scans');
      await settle();
      expect(read).toBeLessThanOrEqual(readAtAbort + 1); // a read already scheduled
      const fragments = transport.take('scans');
      expect(fragments).toHaveLength(sent);
      expect(fragments.some((fragment) => header(fragment, 'x-sequence-last') === true)).toBe(
        false,
      );
    });

    it('publishes no further fragment of a Buffer, nor retries one', async () => {
      const inner = new InMemoryTransport();
      const faulty = new FaultInjectingTransport(inner);
      const gated = await bootSplitter({ transport: faulty });
      const held = deferred();
      faulty.beforePublish = async ({ position }) => {
        if (position === 2) await held.promise;
        if (position === 3) throw new Error('nacked (injected)');
      };
      const controller = new AbortController();
      const sending = gated.send(
        'scans',
        bytes(10_000, 1),
        {
          fragmentBytes: 1_000,
          publish: { inFlight: 2, retry: { attempts: 5, baseDelayMs: 20, maxDelayMs: 20 } },
        },
        controller.signal,
      );
      await eventually(() => faulty.attemptsAt('scans', 3).length > 0, 'the third fragment tried');
      const triedAtAbort = faulty.attemptsAt('scans', 3).length;
      controller.abort(new Error('timed out'));
      held.resolve();

      await expect(sending).rejects.toThrow('timed out');
      expect(faulty.attemptsAt('scans', 3)).toHaveLength(triedAtAbort);
      expect(faulty.attempts.every((attempt) => attempt.position <= 3)).toBe(true);
      expect(
        inner.take('scans').map((fragment) => header(fragment, 'x-sequence-position')),
      ).toEqual([1, 2]);
    });

    it('stops waiting out a publish backoff once aborted', async () => {
      const faulty = new FaultInjectingTransport(new InMemoryTransport());
      const gated = await bootSplitter({ transport: faulty });
      faulty.beforePublish = () => {
        throw new Error('broker down (injected)');
      };
      const controller = new AbortController();
      const sending = gated.send(
        'scans',
        bytes(10, 1),
        { publish: { retry: { attempts: 10, baseDelayMs: 60_000, maxDelayMs: 60_000 } } },
        controller.signal,
      );
      await eventually(() => faulty.attemptsAt('scans', 1).length === 1, 'the first attempt');
      const abortedAt = Date.now();
      controller.abort(new Error('nobody waits (injected)'));

      await expect(sending).rejects.toThrow('nobody waits (injected)');
      expect(Date.now() - abortedAt).toBeLessThan(5_000);
      expect(faulty.attemptsAt('scans', 1)).toHaveLength(1);
    });

    it('reads nothing when the signal aborted before the call', async () => {
      const source = Readable.from([bytes(1_000, 1)]);
      const controller = new AbortController();
      controller.abort(new Error('too late'));

      await expect(splitter.send('scans', source, {}, controller.signal)).rejects.toThrow(
        'too late',
      );
      expect(source.destroyed).toBe(true);
      expect(transport.depth('scans')).toBe(0);
    });
  });

  describe('confirms and retries', () => {
    let faulty: FaultInjectingTransport;
    let inner: InMemoryTransport;

    beforeEach(async () => {
      inner = new InMemoryTransport();
      faulty = new FaultInjectingTransport(inner);
    });

    it('resolves only once every fragment is confirmed', async () => {
      const confirm = deferred();
      faulty.beforePublish = ({ position }) => (position === 3 ? confirm.promise : undefined);
      const slow = await bootSplitter({
        transport: faulty,
        sequence: { fragmentBytes: 100 },
      });

      let resolved = false;
      const sending = slow.send('scans', bytes(300)).then(() => (resolved = true));
      await eventually(() => faulty.attemptsAt('scans', 3).length === 1, 'fragment 3 published');
      await settle();
      expect(resolved).toBe(false);

      confirm.resolve();
      await sending;
      expect(resolved).toBe(true);
    });

    it('asks the transport to confirm within confirmTimeoutMs', async () => {
      const timed = await bootSplitter({ transport: faulty, publish: { confirmTimeoutMs: 1_234 } });

      await timed.send('scans', bytes(10));

      expect(faulty.attempts[0].options).toEqual({ timeoutMs: 1_234 });
    });

    it('retries a failed publish with growing backoff, then delivers every fragment once', async () => {
      faulty.beforePublish = ({ position, attempt }) => {
        if (position === 2 && attempt <= 2) throw new Error(`nack ${attempt}`);
      };
      const retrying = await bootSplitter({
        transport: faulty,
        publish: { retry: { attempts: 5, baseDelayMs: 40, maxDelayMs: 1_000 } },
        sequence: { fragmentBytes: 100 },
      });

      const payload = bytes(300);
      await retrying.send('scans', payload);

      const tries = faulty.attemptsAt('scans', 2);
      expect(tries).toHaveLength(3);
      // Equal jitter: the n-th retry waits between half and all of baseDelayMs × 2^(n-1).
      expect(tries[1].at - tries[0].at).toBeGreaterThanOrEqual(20 - 1);
      expect(tries[2].at - tries[1].at).toBeGreaterThanOrEqual(40 - 1);
      const delivered = inner.take('scans');
      expect(delivered.map((f) => header(f, 'x-sequence-position')).sort()).toEqual([1, 2, 3]);
      const ordered = [...delivered].sort(
        (a, b) =>
          Number(header(a, 'x-sequence-position')) - Number(header(b, 'x-sequence-position')),
      );
      expect(concat(ordered).equals(payload)).toBe(true);
    });

    it('rejects with a SequencePublishError naming the fragment, once its attempts are spent', async () => {
      const thrown: Error[] = [];
      faulty.beforePublish = ({ position, attempt }) => {
        if (position !== 2) return;
        const error = new Error(`nack ${attempt}`);
        thrown.push(error);
        throw error;
      };
      const retrying = await bootSplitter({
        transport: faulty,
        publish: { retry: { attempts: 3, baseDelayMs: 1 } },
        sequence: { fragmentBytes: 100 },
      });

      const error = await retrying
        .send('scans', bytes(500), { sequenceId: 'study-9' })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequencePublishError);
      const failure = error as SequencePublishError;
      expect(failure.name).toBe('SequencePublishError');
      expect(failure).toMatchObject({
        channel: 'scans',
        sequenceId: 'study-9',
        position: 2,
        attempts: 3,
      });
      expect(thrown).toHaveLength(3);
      expect(failure.cause).toBe(thrown[2]);
      expect(failure.message).toContain('study-9');
      expect(failure.message).toContain('fragment 2');
    });

    it('reads no further fragment once one has failed for good', async () => {
      faulty.beforePublish = ({ position }) => {
        if (position === 2) throw new Error('nack');
      };
      const oneAtATime = await bootSplitter({
        transport: faulty,
        publish: { inFlight: 1, retry: { attempts: 2, baseDelayMs: 1 } },
        sequence: { fragmentBytes: 100 },
      });

      await expect(oneAtATime.send('scans', bytes(1_000))).rejects.toBeInstanceOf(
        SequencePublishError,
      );

      expect(faulty.attempts.map((a) => a.position)).toEqual([1, 2, 2]);
    });

    it('reads from a streamed source no further than the fragment it reads ahead, once one has failed for good', async () => {
      faulty.beforePublish = ({ position }) => {
        if (position === 2) throw new Error('nack');
      };
      const oneAtATime = await bootSplitter({
        transport: faulty,
        publish: { inFlight: 1, retry: { attempts: 1 } },
        sequence: { fragmentBytes: 100 },
      });
      let pulled = 0;
      async function* cursor(): AsyncGenerator<Buffer> {
        for (let index = 0; index < 10; index++) {
          pulled++;
          yield Buffer.alloc(100, index);
        }
      }

      await expect(oneAtATime.send('scans', cursor())).rejects.toBeInstanceOf(SequencePublishError);

      // Fragments 1 and 2, and the one read ahead to tell whether 2 was the last.
      expect(pulled).toBe(3);
    });

    // Regression: the fragment being read while a publish fails for good must not go out.
    it('publishes no fragment after one has failed for good, even with slots free', async () => {
      faulty.beforePublish = ({ position }) => {
        if (position === 1) throw new Error('nack');
      };
      const wide = await bootSplitter({
        transport: faulty,
        publish: { inFlight: 3, retry: { attempts: 1 } },
        sequence: { fragmentBytes: 100 },
      });
      async function* slowFile(): AsyncGenerator<Buffer> {
        for (let index = 0; index < 10; index++) {
          await new Promise((resolve) => setTimeout(resolve, 20));
          yield Buffer.alloc(100, index);
        }
      }

      await expect(wide.send('scans', slowFile())).rejects.toBeInstanceOf(SequencePublishError);

      expect(faulty.attempts.map((a) => a.position)).toEqual([1]);
    });

    it('cuts a publish that never confirms at confirmTimeoutMs and reports the timeout', async () => {
      faulty.beforePublish = () => new Promise<void>(() => undefined);
      const impatient = await bootSplitter({
        transport: faulty,
        publish: { confirmTimeoutMs: 50, retry: { attempts: 2, baseDelayMs: 1 } },
      });

      const started = Date.now();
      const error = await impatient
        .send('scans', bytes(10), { sequenceId: 'hung' })
        .catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequencePublishError);
      expect(error).toMatchObject({ sequenceId: 'hung', position: 1, attempts: 2 });
      const cause = (error as SequencePublishError).cause;
      expect(cause).toBeInstanceOf(PublishTimeoutError);
      expect(cause).toMatchObject({ channel: 'scans', timeoutMs: 50 });
      expect(Date.now() - started).toBeGreaterThanOrEqual(2 * 50 - 2);
    });

    it('does not retry a message the transport finds too large', async () => {
      // As a broker whose own limit is below the transport's maxMessageBytes refuses it.
      const tiny = new FaultInjectingTransport(new InMemoryTransport());
      tiny.beforePublish = () => {
        throw new MessageTooLargeError('scans', 1_200, 1_000);
      };
      const retrying = await bootSplitter({
        transport: tiny,
        publish: { retry: { attempts: 5, baseDelayMs: 1 } },
      });

      const error = await retrying.send('scans', bytes(1_000)).catch((e: unknown) => e);

      expect(error).toBeInstanceOf(SequencePublishError);
      expect((error as SequencePublishError).attempts).toBe(1);
      expect((error as SequencePublishError).cause).toBeInstanceOf(MessageTooLargeError);
      expect(tiny.attempts).toHaveLength(1);
    });
  });

  describe('back-pressure and concurrency', () => {
    it('reads a stream at most (inFlight + 1) fragments plus one chunk ahead of the confirms', async () => {
      const fragmentBytes = 1_000;
      const chunkBytes = 300;
      const inFlight = 2;
      const payload = bytes(40 * fragmentBytes + 123);
      let read = 0;
      async function* source(): AsyncGenerator<Buffer> {
        for (let offset = 0; offset < payload.length; offset += chunkBytes) {
          const chunk = payload.subarray(offset, offset + chunkBytes);
          read += chunk.length;
          yield chunk;
        }
      }
      const gates: Array<() => void> = [];
      const gated = new FaultInjectingTransport(new InMemoryTransport());
      gated.beforePublish = () => new Promise<void>((resolve) => gates.push(resolve));
      const streaming = await bootSplitter({
        transport: gated,
        publish: { inFlight },
        sequence: { fragmentBytes: fragmentBytes },
      });

      let done = false;
      const sending = streaming.send('exports', source()).finally(() => (done = true));
      let confirmedBytes = 0;
      let sawFullWindow = false;
      while (!done) {
        await settle();
        const ahead = read - confirmedBytes;
        expect(ahead).toBeLessThanOrEqual((inFlight + 1) * fragmentBytes + chunkBytes);
        if (gated.pending === inFlight) sawFullWindow = true;
        const next = gates.shift();
        if (next) {
          next();
          confirmedBytes += fragmentBytes;
        }
      }

      const receipt = await sending;
      expect(receipt.fragments).toBe(41);
      expect(read).toBe(payload.length);
      expect(sawFullWindow).toBe(true);
    });

    it('streams 64 MiB in 1 MiB fragments holding a few fragments, not the payload', async () => {
      // Only live memory says what the splitter holds: garbage awaiting the collector would swamp
      // it, and array buffers are freed shortly after a collection, hence gc, a pause, gc.
      const gc = exposedGc();
      const drained = { fragments: 0, bytes: 0 };
      await transport.subscribe('bulk', async (message) => {
        drained.fragments++;
        drained.bytes += message.body.length;
        return { action: 'ack' };
      });
      gc();
      const baseline = process.memoryUsage().arrayBuffers;
      let peakGrowth = 0;
      async function* file(): AsyncGenerator<Buffer> {
        for (let index = 0; index < 1_024; index++) {
          if (index % 64 === 0) {
            gc();
            await new Promise((resolve) => setTimeout(resolve, 1));
            gc();
            peakGrowth = Math.max(peakGrowth, process.memoryUsage().arrayBuffers - baseline);
          }
          // A file read stream yields to the event loop between chunks; so does this one. Without
          // that the consumer never runs during the send, and the in-memory transport (which
          // confirms on enqueue) holds every fragment in its queue, as a broker would.
          await new Promise((resolve) => setImmediate(resolve));
          yield Buffer.alloc(64 * KiB, index);
        }
      }

      const receipt = await splitter.send('bulk', file(), { fragmentBytes: MiB });
      await transport.whenIdle();

      expect(receipt).toMatchObject({ fragments: 64, bytes: 64 * MiB });
      expect(drained).toEqual({ fragments: 64, bytes: 64 * MiB });
      expect(peakGrowth).toBeLessThan(16 * MiB);
    });

    it('keeps at most inFlight publishes awaiting a confirm at once', async () => {
      const slow = new FaultInjectingTransport(new InMemoryTransport());
      slow.beforePublish = () => new Promise((resolve) => setTimeout(resolve, 10));
      const three = await bootSplitter({
        transport: slow,
        publish: { inFlight: 3 },
        sequence: { fragmentBytes: 100 },
      });

      await three.send('scans', bytes(1_200));

      expect(slow.attempts).toHaveLength(12);
      expect(slow.maxPending).toBeLessThanOrEqual(3);
      expect(slow.maxPending).toBeGreaterThanOrEqual(2);
    });

    it('publishes strictly one at a time with inFlight 1', async () => {
      const slow = new FaultInjectingTransport(new InMemoryTransport());
      slow.beforePublish = () => new Promise((resolve) => setTimeout(resolve, 5));
      const serial = await bootSplitter({
        transport: slow,
        publish: { inFlight: 1 },
        sequence: { fragmentBytes: 100 },
      });

      await serial.send('scans', bytes(600));

      expect(slow.attempts).toHaveLength(6);
      expect(slow.maxPending).toBe(1);
    });
  });
});
