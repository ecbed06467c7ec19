import { PassThrough, Readable } from 'node:stream';
import { runInNewContext } from 'node:vm';
import {
  InMemoryTransport,
  SequenceOptionsError,
  SequencePublishError,
  type SendOptions,
} from 'nest-sequence';
import { FaultInjectingTransport, bytes } from '../../test/support/sequence-test-app';
import { bootSplitter, closeSplitters } from '../../test/support/splitter-app';

afterEach(closeSplitters);

const HUNG = Symbol('hung');

describe('SplitterService: sources and per-call options', () => {
  it('reports a fragment that failed for good even while the source has nothing more to give, and closes the source', async () => {
    const faulty = new FaultInjectingTransport(new InMemoryTransport());
    faulty.beforePublish = (attempt) => {
      if (attempt.position === 1) throw new Error('broker refused');
    };
    const splitter = await bootSplitter({
      transport: faulty,
      publish: { retry: { attempts: 1, baseDelayMs: 0 }, inFlight: 4 },
    });
    // A live source (a socket, a tail): 25 bytes now, more later, maybe much later.
    const source = new PassThrough();
    source.write(bytes(25));

    const outcome = await Promise.race([
      splitter.send('scans', source, { fragmentBytes: 10, sequenceId: 'live-1' }).then(
        () => 'resolved',
        (error: unknown) => error,
      ),
      new Promise((resolve) => setTimeout(() => resolve(HUNG), 1_000)),
    ]);
    const destroyed = source.destroyed;
    source.destroy();

    // Fragment 1 was refused for good within milliseconds: send must say so, not wait for the
    // source to produce a byte it may never produce.
    expect(outcome).not.toBe(HUNG);
    expect(outcome).toBeInstanceOf(SequencePublishError);
    expect(outcome).toMatchObject({ sequenceId: 'live-1', position: 1 });
    expect(destroyed).toBe(true);
  });

  it("refuses an unknown via (a typo of 'claim-check') with a SequenceOptionsError instead of silently sending through the broker", async () => {
    const transport = new InMemoryTransport();
    const splitter = await bootSplitter({ transport });

    const error = await splitter
      .send('scans', bytes(10), { via: 'claimcheck' as SendOptions['via'] })
      .then(
        () => undefined,
        (e: unknown) => e,
      );

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(transport.depth('scans')).toBe(0);
  });

  it('refuses a contentType / contentEncoding that is not a string, which the consumer would silently drop', async () => {
    const transport = new InMemoryTransport();
    const splitter = await bootSplitter({ transport });

    const error = await splitter
      .send('scans', bytes(10), {
        contentType: 42 as unknown as string,
        contentEncoding: { gzip: true } as unknown as string,
      })
      .then(
        () => undefined,
        (e: unknown) => e,
      );

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(transport.depth('scans')).toBe(0);
  });

  it.each([
    ['a string', 'abc'],
    ['an array', ['a']],
  ])(
    'refuses headers given as %s, which would become headers 0, 1, ...',
    async (_what, headers) => {
      const transport = new InMemoryTransport();
      const splitter = await bootSplitter({ transport });

      const error = await splitter
        .send('scans', bytes(10), { headers: headers as unknown as Record<string, string> })
        .then(
          () => undefined,
          (e: unknown) => e,
        );

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toContain(
        'headers must be an object of string, number or boolean values',
      );
      expect(transport.depth('scans')).toBe(0);
    },
  );

  it.each([
    ['a number', 42],
    ['null', null],
    ['a plain object', { id: 7 }],
    ['a string', 'a report'],
    ['records that are not iterable', { records: 42 }],
  ])(
    'refuses %s as the payload with a SequenceOptionsError naming what it takes, sending nothing',
    async (_label, payload) => {
      const transport = new InMemoryTransport();
      const splitter = await bootSplitter({ transport });

      const error = await splitter.send('scans', payload as never).then(
        () => undefined,
        (e: unknown) => e,
      );

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        expect.stringMatching(
          /^payload must be a Buffer or Uint8Array, a Readable, an AsyncIterable/,
        ),
      ]);
      expect(transport.depth('scans')).toBe(0);
    },
  );

  it('sends a Uint8Array made in another realm (vm, worker) as bytes, as it does for stream chunks', async () => {
    const transport = new InMemoryTransport();
    const splitter = await bootSplitter({ transport });
    const payload = runInNewContext('new Uint8Array([1, 2, 3, 4, 5])') as Uint8Array;

    const receipt = await splitter.send('scans', payload, { fragmentBytes: 2 });

    expect(receipt).toMatchObject({ fragments: 3, bytes: 5 });
    const sent = transport.peek('scans');
    expect(Buffer.concat(sent.map((m) => m.body))).toEqual(Buffer.from([1, 2, 3, 4, 5]));
    // Known length: the size travels on every fragment.
    expect(sent.map((m) => m.headers['x-sequence-size'])).toEqual([3, 3, 3]);
  });

  it('closes a records stream it refuses to send, as it closes a Readable payload (a file handle is not left open)', async () => {
    const transport = new InMemoryTransport();
    const splitter = await bootSplitter({ transport });
    const records = Readable.from([bytes(10, 1), bytes(10, 2)]);

    const error = await splitter.send('scans', { records }, { fragmentBytes: 0 }).then(
      () => undefined,
      (e: unknown) => e,
    );

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(records.destroyed).toBe(true);
  });
});
