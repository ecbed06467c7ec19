import { Injectable } from '@nestjs/common';
import {
  ClaimCheck,
  FilesystemPayloadStore,
  SequenceHandlerConflictError,
  SequenceOptionsError,
  type ClaimedPayload,
} from 'nest-sequence';
import type { ClaimCheckOptions, ClaimRetention } from '../../src/options/claim-check.options';
import { recordingHandler } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  DEFAULT_CHANNEL,
  filesUnder,
  type ClaimCheckTestAppOptions,
} from './claim-check-test-app';

/**
 * Claim Check options are validated while the module builds: a bad option stops the application
 * from starting, with every problem listed and named by its option path. So does a channel that
 * two handlers claim.
 */
describe('claim check: options validation at boot', () => {
  /** Boots an app with `claimCheck` (and `module`) options and returns why it did not start. */
  async function bootFailure(
    claimCheck: ClaimCheckOptions,
    module?: ClaimCheckTestAppOptions['module'],
  ): Promise<SequenceOptionsError> {
    const error: unknown = await createClaimCheckTestApp({ claimCheck, module }).then(
      async (t) => {
        await t.close();
        return undefined;
      },
      (rejection: unknown) => rejection,
    );
    expect(error).toBeInstanceOf(SequenceOptionsError);
    return error as SequenceOptionsError;
  }

  it.each([
    [-1, 'claimCheck.inlineMaxBytes must be an integer >= 0, got -1'],
    [1.5, 'claimCheck.inlineMaxBytes must be an integer >= 0, got 1.5'],
    [Number.NaN, 'claimCheck.inlineMaxBytes must be an integer >= 0, got NaN'],
  ])('inlineMaxBytes %p: refused', async (inlineMaxBytes, problem) => {
    const error = await bootFailure({ inlineMaxBytes });
    expect(error.problems).toEqual([problem]);
    expect(error.message).toContain(problem);
  });

  it.each<[string, unknown]>([
    ['an unknown word', 'never'],
    ['zero consumers', { consumers: 0 }],
    ['a fractional count', { consumers: 1.5 }],
    ['no count', {}],
  ])('deleteAfter of %s: refused', async (_what, deleteAfter) => {
    const error = await bootFailure({ deleteAfter: deleteAfter as ClaimRetention });
    expect(error.problems).toHaveLength(1);
    expect(error.problems[0]).toMatch(
      /^claimCheck\.deleteAfter must be 'ack', 'ttl' or \{ consumers: N \} with N ≥ 1/,
    );
  });

  it.each([0, 150_000])(
    'an orphanGraceMs (%p) the sweeper could take a payload within while its ticket is published: refused',
    async (orphanGraceMs) => {
      const error = await bootFailure({ orphanGraceMs });
      // The test app's publish policy: the module defaults (5 attempts, 10 s confirms, 5 s delays).
      expect(error.problems).toEqual([
        `claimCheck.orphanGraceMs (${orphanGraceMs}) must be above twice the longest a ticket's ` +
          'publish may take with its retries (publish.retry.attempts × (publish.confirmTimeoutMs ' +
          '+ publish.retry.maxDelayMs) ' +
          '= 75000 ms), that is above 150000 ms',
      ]);
    },
  );

  it("an inlineMaxBytes above what one of the transport's messages carries: refused", async () => {
    // The in-memory transport carries 16 MiB; 16 KiB of it are left to headers.
    const error = await bootFailure({
      inlineMaxBytes: 16 * 1024 * 1024,
    });
    expect(error.problems).toEqual([
      'claimCheck.inlineMaxBytes (16777216) exceeds what one message of the transport carries ' +
        '(16760832 bytes besides headers); use at most 16760832',
    ]);
  });

  it('per call: a fractional ttl, a negative inlineMaxBytes and a header of the wire contract are refused before anything is stored', async () => {
    const t = await createClaimCheckTestApp({});
    try {
      const refusal = await t.claimCheck
        .publish(DEFAULT_CHANNEL, Buffer.alloc(10), {
          ttlMs: 1.5,
          contentType: 'text/plain\n',
          headers: { 'x-sequence-id': 'mine', 'x-claim-check': 1, 'x-requeue-count': 3 },
          inlineMaxBytes: -1,
        })
        .catch((error: unknown) => error);

      expect(refusal).toBeInstanceOf(SequenceOptionsError);
      expect((refusal as SequenceOptionsError).problems).toEqual([
        'ttlMs must be an integer ≥ 1, got 1.5',
        'inlineMaxBytes must be an integer ≥ 0, got -1',
        'contentType must be 1-255 printable ASCII characters (a media type)',
        'header x-sequence-id belongs to the wire contract; rename yours',
        'header x-claim-check belongs to the wire contract; rename yours',
        'header x-requeue-count is set by the broker or transport on each delivery; do not send it',
      ]);
      await expect(t.claimCheck.checkIn(Buffer.alloc(10), { ttlMs: 0 })).rejects.toBeInstanceOf(
        SequenceOptionsError,
      );
      // Metadata is stored as strings, and read back as such: another value would be refused on
      // the way out (as corrupt metadata), so it is refused on the way in.
      const metadata = { pages: 3 } as unknown as Record<string, string>;
      await expect(t.claimCheck.checkIn(Buffer.alloc(10), { metadata })).rejects.toThrow(
        'metadata must be an object of strings',
      );
      // A mode that is neither (a typo) is refused, not taken for 'claim-check'.
      const mode = 'Auto' as unknown as 'auto';
      await expect(
        t.claimCheck.publish(DEFAULT_CHANNEL, Buffer.alloc(10), { mode }),
      ).rejects.toThrow(`mode must be 'claim-check' or 'auto', got "Auto"`);
      expect(await filesUnder(t.root)).toEqual([]);
    } finally {
      await t.close();
    }
  });

  it.each([
    ['x-sequence-note', 100],
    ['x-fragment-note', 100],
    ['X-Sequence-Id', 100],
    ['x-sequence-note', 300 * 1024], // would go as a ticket
  ])(
    'per call: a header %s in the fragment space is refused (%d bytes): receivers take it for a fragment',
    async (name, size) => {
      const t = await createClaimCheckTestApp({});
      try {
        const refusal = await t.claimCheck
          .publish(DEFAULT_CHANNEL, Buffer.alloc(size), { headers: { [name]: 'a' } })
          .catch((error: unknown) => error);

        expect(refusal).toBeInstanceOf(SequenceOptionsError);
        expect((refusal as SequenceOptionsError).problems).toEqual([
          `header ${name} is in the wire contract's x-sequence-* / x-fragment-* space (any case); rename yours`,
        ]);
      } finally {
        await t.close();
      }
    },
  );

  it.each<[string, unknown]>([
    ['a number', 42],
    ['null', null],
    ['a plain object', { id: 7 }],
    ['a string', 'a report'],
  ])(
    'per call: %s as the payload is refused with the types publish and checkIn take, nothing stored',
    async (_label, payload) => {
      const t = await createClaimCheckTestApp({});
      try {
        const published = await t.claimCheck
          .publish(DEFAULT_CHANNEL, payload as Buffer)
          .catch((error: unknown) => error);
        const checkedIn = await t.claimCheck
          .checkIn(payload as Buffer)
          .catch((error: unknown) => error);

        expect(published).toBeInstanceOf(SequenceOptionsError);
        expect((published as SequenceOptionsError).problems).toEqual([
          expect.stringMatching(
            /^payload must be a Buffer or Uint8Array, a Readable, or \{ records \}/,
          ),
        ]);
        expect(checkedIn).toBeInstanceOf(SequenceOptionsError);
        expect((checkedIn as SequenceOptionsError).problems).toEqual([
          expect.stringMatching(/^payload must be a Buffer or Uint8Array, or a Readable, got/),
        ]);
        expect(await filesUnder(t.root)).toEqual([]);
      } finally {
        await t.close();
      }
    },
  );

  it('per call: a Uint8Array that is not a Buffer is taken as its bytes, as send() takes it', async () => {
    const t = await createClaimCheckTestApp({});
    try {
      const small = new Uint8Array([1, 2, 3]);
      const large = new Uint8Array(300 * 1024).fill(7);

      const inline = await t.claimCheck.publish(DEFAULT_CHANNEL, small as Buffer);
      const ticketed = await t.claimCheck.publish(DEFAULT_CHANNEL, large as Buffer);
      const ticket = await t.claimCheck.checkIn(large as Buffer);
      const back = await t.claimCheck.checkOut(ticket);

      expect(inline).toMatchObject({ via: 'inline', bytes: 3 });
      expect(ticketed).toMatchObject({ via: 'ticket', bytes: large.length });
      expect(await back.toBuffer()).toEqual(Buffer.from(large));
    } finally {
      await t.close();
    }
  });

  it("dead-letters to the channel's <channel>.dlq, not the module's sequence.deadLetterChannel", async () => {
    const t = await createClaimCheckTestApp({
      module: { sequence: { deadLetterChannel: 'sequences.dlq' } },
    });
    try {
      await publishTicket(t.transport, t.channel, Buffer.from('not a ticket'));
      await t.transport.whenIdle();

      expect(deathReasons(t.transport, t.channel)).toEqual([
        expect.stringMatching(/^claim-ticket-invalid: /),
      ]);
      expect(t.transport.peek('sequences.dlq')).toEqual([]);
    } finally {
      await t.close();
    }
  });

  it('a signing secret under 32 bytes: refused, naming the key', async () => {
    const error = await bootFailure({ signingKeys: [{ id: 'k-2026', secret: 'too-short' }] });
    expect(error.problems).toEqual([
      expect.stringMatching(
        /^claimCheck\.signingKeys: key "k-2026": secret is 9 bytes; use at least 32/,
      ),
    ]);
  });

  it('an empty key list: refused', async () => {
    const error = await bootFailure({ signingKeys: [] });
    expect(error.problems[0]).toMatch(/^claimCheck\.signingKeys: give at least one key/);
  });

  it('a ttl of 0: refused', async () => {
    const error = await bootFailure({ ttlMs: 0 });
    expect(error.problems).toContain('claimCheck.ttlMs must be an integer >= 1, got 0');
  });

  it('a sweep interval of 0: refused (the sweeper would run in a hot loop)', async () => {
    const error = await bootFailure({}, { tuning: { sweepers: { orphans: { intervalMs: 0 } } } });
    expect(error.problems).toEqual([
      'tuning.sweepers.orphans.intervalMs must be above 0 (or false to turn it off on this instance)',
    ]);
  });

  it('a sweep interval longer than a Node timer waits: refused (Node would fire it every 1 ms)', async () => {
    const thirtyDays = 30 * 24 * 60 * 60 * 1000;
    const error = await bootFailure(
      {},
      { tuning: { sweepers: { orphans: { intervalMs: thirtyDays } } } },
    );
    expect(error.problems).toEqual([
      'tuning.sweepers.orphans.intervalMs must be at most 2147483647 ms (the longest a timer ' +
        `waits), got ${thirtyDays}`,
    ]);
  });

  it('the longest sweep interval a timer waits: accepted', async () => {
    const t = await createClaimCheckTestApp({
      module: {
        tuning: { sweepers: { orphans: { intervalMs: 2 ** 31 - 1 } } },
      },
    });
    expect(t.options.tuning.sweepers.orphans.intervalMs).toBe(2 ** 31 - 1);
    await t.close();
  });

  it.each([
    [-1, 'claimCheck.expiredGraceMs must be an integer >= 0, got -1'],
    [1.5, 'claimCheck.expiredGraceMs must be an integer >= 0, got 1.5'],
    [
      Number.MAX_SAFE_INTEGER,
      `claimCheck.expiredGraceMs must be at most 3153600000000 (100 years), got ${Number.MAX_SAFE_INTEGER}`,
    ],
  ])('an expiredGraceMs of %p: refused', async (expiredGraceMs, problem) => {
    const error = await bootFailure({ expiredGraceMs });
    expect(error.problems).toEqual([problem]);
  });

  it('an encryption key that is not 32 bytes: refused', async () => {
    const error = await bootFailure({ encryption: { keys: [{ id: 'k', key: Buffer.alloc(16) }] } });
    expect(error.problems[0]).toMatch(/^claimCheck\.encryption: key "k": key must be 32 bytes/);
  });

  it('two stores of one name: refused, since tickets name their store', async () => {
    const error = await bootFailure({
      readStores: [new FilesystemPayloadStore({ root: '/nonexistent/never-used' })],
    });
    expect(error.problems[0]).toMatch(/two payload stores are named "filesystem"/);
  });

  it.each([
    [
      'one store, not in a list',
      new FilesystemPayloadStore({ root: '/nonexistent/never-used' }),
      /^claimCheck\.readStores must be an array of PayloadStores, got an object$/,
    ],
    [
      'a string',
      'archive',
      /^claimCheck\.readStores must be an array of PayloadStores, got a string$/,
    ],
    [
      'a list with a hole (a store left out by a condition)',
      [undefined],
      /^claimCheck\.readStores\[0\] must be a PayloadStore, got undefined$/,
    ],
    [
      'a list with a hole in it',
      // eslint-disable-next-line no-sparse-arrays
      [, new FilesystemPayloadStore({ root: '/nonexistent/never-used' })],
      /^claimCheck\.readStores\[0\] must be a PayloadStore, got undefined$/,
    ],
    [
      'a list with something that is not a store',
      [{ name: 'archive' }],
      /^claimCheck\.readStores\[0\] must be a PayloadStore \(it has no put, get, close\)/,
    ],
  ])('readStores as %s: refused with the list of problems', async (_, readStores, problem) => {
    // Past the types, as a forRootAsync factory or plain JavaScript can pass it.
    const error = await bootFailure({ readStores } as unknown as ClaimCheckOptions);
    expect(error.problems).toEqual([expect.stringMatching(problem)]);
  });

  it('a store whose name tickets cannot carry: refused, before any payload is stored under it', async () => {
    const misnamed = Object.assign(
      new FilesystemPayloadStore({ root: '/nonexistent/never-used' }),
      {
        name: 'Archive EU',
      },
    );
    const error = await bootFailure({ readStores: [misnamed] });
    expect(error.problems[0]).toMatch(/payload store name "Archive EU" cannot travel in a ticket/);
  });

  it('a ttl whose expiry is past what a ticket can say: refused, at boot and per call', async () => {
    const error = await bootFailure({ ttlMs: Number.MAX_SAFE_INTEGER });
    expect(error.problems).toEqual([expect.stringMatching(/^claimCheck\.ttlMs must be at most /)]);
    const t = await createClaimCheckTestApp();
    try {
      await expect(
        t.claimCheck.checkIn(Buffer.from('x'), { ttlMs: Number.MAX_SAFE_INTEGER }),
      ).rejects.toThrow(/ttlMs must be at most /);
    } finally {
      await t.close();
    }
  });

  it('every problem at once', async () => {
    const error = await bootFailure({
      deleteAfter: { consumers: 0 },
      signingKeys: [{ id: 'short', secret: Buffer.alloc(8) }],
      inlineMaxBytes: -5,
    });
    expect(error.problems).toHaveLength(3);
    expect(error.problems.join('\n')).toMatch(/inlineMaxBytes[\s\S]*deleteAfter[\s\S]*signingKeys/);
  });

  it('good options boot (the failures above are about the options, not the harness)', async () => {
    const t = await createClaimCheckTestApp({
      claimCheck: {
        deleteAfter: { consumers: 2 },
        signingKeys: [{ id: 'k-2026', secret: Buffer.alloc(32, 1) }],
        inlineMaxBytes: 0,
      },
    });
    expect(t.options.claimCheck.inlineMaxBytes).toBe(0);
    expect(t.options.claimCheck.keyring.signingKeyId).toBe('k-2026');
    await t.close();
  });

  describe('handlers', () => {
    it('a @ClaimCheck with a bad deleteAfter: the app does not start', async () => {
      const error: unknown = await createClaimCheckTestApp({
        handlers: [{ channel: 'cc.bad', deleteAfter: { consumers: -1 } }],
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).where).toMatch(/^@ClaimCheck on \w+\.handle$/);
      expect((error as SequenceOptionsError).problems[0]).toMatch(/^deleteAfter must be/);
    });

    it('a @ClaimCheck and a @SequencedHandler on one channel: the app does not start', async () => {
      const error: unknown = await createClaimCheckTestApp({
        providers: [recordingHandler({ channel: DEFAULT_CHANNEL })],
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SequenceHandlerConflictError);
      expect(error).toMatchObject({ channel: DEFAULT_CHANNEL });
    });

    it('two @ClaimCheck methods on one channel: the app does not start', async () => {
      @Injectable()
      class SecondHandler {
        @ClaimCheck({ channel: DEFAULT_CHANNEL })
        async handle(_payload: ClaimedPayload): Promise<void> {}
      }
      const error: unknown = await createClaimCheckTestApp({
        providers: [SecondHandler],
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SequenceHandlerConflictError);
      expect((error as SequenceHandlerConflictError).second).toMatch(/\.handle$/);
    });
  });
});
