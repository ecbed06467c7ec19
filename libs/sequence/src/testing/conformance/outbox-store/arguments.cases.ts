import type {
  BoxName,
  ClaimOptions,
  NewBoxRecord,
  PurgeOptions,
  RecordOutcome,
  StoredRecord,
} from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  claimWith,
  record,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/** The latest time a store takes: the latest a `Date` can hold (8.64e15 ms). */
const LATEST = 8_640_000_000_000_000;

/** Values the cases pass where the port's types do not allow them (callers in plain JS). */
const bad = <T>(value: unknown): T => value as T;

const NOT_A_TIME: ReadonlyArray<readonly [string, unknown]> = [
  ['NaN', Number.NaN],
  ['Infinity', Number.POSITIVE_INFINITY],
  ['negative', -1],
  ['fractional', 1.5],
  ['past the latest Date', LATEST + 1],
  ['a string', '1000'],
  ['absent', undefined],
];

const NOT_A_COUNT: ReadonlyArray<readonly [string, unknown]> = [
  ['0', 0],
  ['negative', -1],
  ['fractional', 1.5],
  ['NaN', Number.NaN],
  ['Infinity', Number.POSITIVE_INFINITY],
  ['a string', '10'],
  ['absent', undefined],
];

const NOT_AN_ID: ReadonlyArray<readonly [string, unknown]> = [
  ['a number', 42],
  ['empty', ''],
  ['201 characters', 'i'.repeat(201)],
  ['201 emoji (code points, not UTF-16 units)', '😀'.repeat(201)],
  ['holding NUL', 'r-\u00001'],
  ['holding a lone surrogate', 'r-\ud8001'],
  ['null', null],
  ['absent', undefined],
];

const NOT_IDS: ReadonlyArray<readonly [string, unknown]> = [
  ['a string, not an array', 'r-1'],
  ['absent', undefined],
  ['an object', { 0: 'r-1', length: 1 }],
  ...NOT_AN_ID.map(
    ([what, id]) => [`an array holding an id that is ${what}`, ['r-1', id]] as const,
  ),
];

const NOT_A_RECORD: ReadonlyArray<readonly [string, unknown]> = [
  ...NOT_AN_ID.map(
    ([what, id]) => [`an id that is ${what}`, record('x', { id: bad(id) })] as const,
  ),
  ['an unknown kind', record('x', { kind: bad('note') })],
  ['an empty type', record('x', { type: '' })],
  ['a type that is not a string', record('x', { type: bad(7) })],
  ['a partition key that is not a string', record('x', { partitionKey: bad(7) })],
  ['a body that is not a string', record('x', { body: bad({ orderId: 'x' }) })],
  ['headers that are not an object', record('x', { headers: bad('x-a: 1') })],
  ['a header value that is not a string', record('x', { headers: bad({ 'x-a': 1 }) })],
  // Text no database column holds alike: PostgreSQL refuses NUL, and UTF-8 has no lone surrogate
  // (a driver would store U+FFFD, so two ids could become one).
  ['a type holding NUL', record('x', { type: 'order\u0000placed' })],
  ['a partition key holding a lone surrogate', record('x', { partitionKey: 'p-\udc00' })],
  ['a body holding NUL', record('x', { body: '{"a":"\u0000"}' })],
  ['a body holding a lone surrogate', record('x', { body: '{"a":"\ud800"}' })],
  ['a header name holding NUL', record('x', { headers: { 'x-\u0000': '1' } })],
  ['a header value holding NUL', record('x', { headers: { 'x-a': '1\u0000' } })],
  ['a header value holding a lone surrogate', record('x', { headers: { 'x-a': '\ud800' } })],
  ['null', null],
];

/**
 * Arguments outside the port's contract (from callers in plain JavaScript, or computed wrong):
 * every store refuses them the same way, with a `RangeError` naming the argument, before it
 * touches the database, so that nothing of the call is done. Values at the edges of the contract
 * are taken.
 */
export function describeArgumentCases(c: OutboxSuiteContext): void {
  /** `ids` appended and left FAILED (one claim settling each as failed). */
  async function failedRecords(...ids: string[]): Promise<StoredRecord[]> {
    await appendCommitted(
      c.store,
      BOX,
      ids.map((id) => record(id)),
    );
    await claimWith(c.store, BOX, { limit: 100, now: c.t0 }, (each) => ({
      id: each.id,
      status: 'failed',
      error: 'poison',
    }));
    return Promise.all(ids.map(async (id) => (await c.store.get(BOX, id))!));
  }

  /** Rejects with a RangeError whose message matches `names`. */
  async function refused(call: () => Promise<unknown>, names: RegExp): Promise<void> {
    const settled = call().then(
      () => undefined,
      (error: unknown) => error,
    );
    const error = await settled;
    expect(error).toBeInstanceOf(RangeError);
    expect((error as Error).message).toMatch(names);
  }

  describe('arguments', () => {
    describe('an unknown box', () => {
      const unknown = bad<BoxName>('outbox_everything');
      it.each<[string, () => Promise<unknown>]>([
        ['append', () => c.store.transaction((tx) => c.store.append(unknown, [record('x')], tx))],
        ['receive', () => c.store.receive(unknown, record('x'))],
        ['claim', () => c.store.claim(unknown, { limit: 1, now: c.t0 }, async () => [])],
        ['get', () => c.store.get(unknown, 'x')],
        ['listFailed', () => c.store.listFailed(unknown, 10)],
        ['retry', () => c.store.retry(unknown, ['x'], c.t0)],
        [
          'discard',
          () => {
            if (!c.store.discard) throw new Error(`${c.store.name} does not implement discard`);
            return c.store.discard(unknown, ['x']);
          },
        ],
        ['purge', () => c.store.purge(unknown, { completedBefore: c.t0, batchSize: 10 })],
        ['stats', () => c.store.stats(unknown)],
      ])('is refused by %s', async (_method, call) => {
        await refused(call, /box/);
      });
    });

    describe('append and receive', () => {
      it.each(NOT_A_RECORD)(
        'refuse a record with %s, appending nothing of the call',
        async (_what, wrong) => {
          await refused(
            () =>
              c.store.transaction((tx) =>
                c.store.append(BOX, [record('good'), wrong as NewBoxRecord], tx),
              ),
            /record|id/,
          );
          await refused(() => c.store.receive('inbox_events', wrong as NewBoxRecord), /record|id/);
          await expect(c.store.get(BOX, 'good')).resolves.toBeUndefined();
          await expect(c.store.stats('inbox_events')).resolves.toMatchObject({ pending: 0 });
        },
      );

      it('refuse records that are not an array', async () => {
        await refused(
          () => c.store.transaction((tx) => c.store.append(BOX, bad(record('x')), tx)),
          /records/,
        );
      });

      it('take an id of 200 characters, counted as code points (200 emoji are 400 UTF-16 units)', async () => {
        const id = '😀'.repeat(200);
        await expect(appendCommitted(c.store, BOX, [record(id)])).resolves.toEqual([id]);
        await expect(c.store.receive('inbox_events', record(id))).resolves.toBe('added');
        await expect(c.store.get(BOX, id)).resolves.toMatchObject({ id });
      });
    });

    describe('claim', () => {
      async function refusedClaim(options: unknown, names: RegExp): Promise<void> {
        await appendCommitted(c.store, BOX, [record('due')]);
        let called = false;
        await refused(
          () =>
            c.store.claim(BOX, options as ClaimOptions, async () => {
              called = true;
              return [];
            }),
          names,
        );
        expect(called).toBe(false);
      }

      it.each(NOT_A_COUNT)('refuses a limit that is %s, handing nothing out', async (_, limit) => {
        await refusedClaim({ limit, now: c.t0 }, /limit/);
      });

      it.each(NOT_A_TIME)('refuses a now that is %s, handing nothing out', async (_, now) => {
        await refusedClaim({ limit: 10, now }, /now/);
      });

      it('refuses options that are not an object', async () => {
        await refusedClaim(undefined, /limit|options/);
      });

      it('takes the edges: a limit of 1, a now of 0 and of the latest Date', async () => {
        await appendCommitted(c.store, BOX, [record('r-1'), record('r-2')]);
        await expect(claimAndComplete(c.store, BOX, { limit: 1, now: 0 })).resolves.toEqual([
          'r-1',
        ]);
        await expect(claimAndComplete(c.store, BOX, { limit: 1, now: LATEST })).resolves.toEqual([
          'r-2',
        ]);
      });
    });

    describe('claim outcomes', () => {
      const NOT_OUTCOMES: ReadonlyArray<readonly [string, unknown, RegExp]> = [
        ['not an array', { id: 'r-1', status: 'completed' }, /outcomes/],
        [
          'for a record the claim did not hand out',
          [{ id: 'stranger', status: 'completed' }],
          /stranger/,
        ],
        [
          'two for one record',
          [
            { id: 'r-1', status: 'completed' },
            { id: 'r-1', status: 'released' },
          ],
          /two/,
        ],
        ['of an unknown status', [{ id: 'r-1', status: 'done' }], /status/],
        ['null', [null], /outcome/],
        ['a retry without an error', [{ id: 'r-1', status: 'retry', nextAttemptAt: 1 }], /error/],
        ['a failure without an error', [{ id: 'r-1', status: 'failed' }], /error/],
        ...NOT_A_TIME.map(
          ([what, time]) =>
            [
              `a retry whose nextAttemptAt is ${what}`,
              [{ id: 'r-1', status: 'retry', nextAttemptAt: time, error: 'later' }],
              /nextAttemptAt/,
            ] as const,
        ),
      ];

      it.each(NOT_OUTCOMES)(
        'refuses outcomes %s, rolling the claim back',
        async (_what, outcomes, names) => {
          await appendCommitted(c.store, BOX, [record('r-1'), record('r-2')]);
          await refused(
            () =>
              c.store.claim(BOX, { limit: 10, now: c.t0 }, async () =>
                bad<RecordOutcome[]>(outcomes),
              ),
            names,
          );
          for (const id of ['r-1', 'r-2']) {
            await expect(c.store.get(BOX, id)).resolves.toMatchObject({
              status: 'PENDING',
              attempts: 0,
              lastError: null,
            });
          }
        },
      );

      // An error's text comes from anywhere (a broker's reply, a handler's exception): it is
      // kept, with U+FFFD for what no column holds, rather than failing the claim's settle.
      it('keeps an error holding NUL or a lone surrogate, each replaced by U+FFFD', async () => {
        await appendCommitted(c.store, BOX, [record('r-1'), record('r-2')]);
        await claimWith(c.store, BOX, { limit: 10, now: c.t0 }, (each) =>
          each.id === 'r-1'
            ? { id: each.id, status: 'failed', error: 'refused\u0000 by \ud800 broker' }
            : { id: each.id, status: 'retry', nextAttemptAt: c.t0, error: '\udc00\u0000' },
        );
        await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
          status: 'FAILED',
          lastError: 'refused\ufffd by \ufffd broker',
        });
        await expect(c.store.get(BOX, 'r-2')).resolves.toMatchObject({
          status: 'PENDING',
          lastError: '\ufffd\ufffd',
        });
      });
    });

    describe('get', () => {
      it.each(NOT_AN_ID)('refuses an id that is %s', async (_, id) => {
        await refused(() => c.store.get(BOX, bad(id)), /id/);
      });
    });

    describe('listFailed', () => {
      it.each(NOT_A_COUNT)('refuses a limit that is %s', async (_, limit) => {
        await refused(() => c.store.listFailed(BOX, bad(limit)), /limit/);
      });
    });

    describe('retry', () => {
      it.each(NOT_IDS)('refuses ids that are %s, retrying none of them', async (_, ids) => {
        const before = await failedRecords('r-1');
        await refused(() => c.store.retry(BOX, bad(ids), c.t0), /id/);
        await expect(c.store.get(BOX, 'r-1')).resolves.toEqual(before[0]);
      });

      it.each(NOT_A_TIME)('refuses a now that is %s, retrying nothing', async (_, now) => {
        const before = await failedRecords('r-1');
        await refused(() => c.store.retry(BOX, ['r-1'], bad(now)), /now/);
        await expect(c.store.get(BOX, 'r-1')).resolves.toEqual(before[0]);
      });

      it('refuses a bad now even with no ids, and takes an empty list with a good one', async () => {
        await refused(() => c.store.retry(BOX, [], Number.NaN), /now/);
        await expect(c.store.retry(BOX, [], c.t0)).resolves.toBe(0);
      });
    });

    describe('discard', () => {
      it.each(NOT_IDS)('refuses ids that are %s, deleting none of them', async (_, ids) => {
        const discard = c.store.discard?.bind(c.store);
        if (!discard) throw new Error(`${c.store.name} does not implement discard`);
        const before = await failedRecords('r-1');
        await refused(() => discard(BOX, bad(ids)), /id/);
        await expect(c.store.get(BOX, 'r-1')).resolves.toEqual(before[0]);
      });
    });

    describe('purge', () => {
      async function refusedPurge(options: unknown, names: RegExp): Promise<void> {
        await appendCommitted(c.store, BOX, [record('done')]);
        await claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 });
        await refused(() => c.store.purge(BOX, options as PurgeOptions), names);
        await expect(c.store.get(BOX, 'done')).resolves.toMatchObject({ status: 'COMPLETED' });
      }

      it.each(NOT_A_TIME)(
        'refuses a completedBefore that is %s, deleting nothing',
        async (_, completedBefore) => {
          await refusedPurge({ completedBefore, batchSize: 10 }, /completedBefore/);
        },
      );

      it.each(NOT_A_COUNT)(
        'refuses a batchSize that is %s, deleting nothing',
        async (_, batchSize) => {
          await refusedPurge({ completedBefore: c.t0 + 1, batchSize }, /batchSize/);
        },
      );

      it.each(NOT_A_COUNT.filter(([what]) => what !== 'absent'))(
        'refuses a maxBatches that is %s, deleting nothing',
        async (_, maxBatches) => {
          await refusedPurge(
            { completedBefore: c.t0 + 1, batchSize: 10, maxBatches },
            /maxBatches/,
          );
        },
      );

      it('refuses options that are not an object', async () => {
        await refusedPurge(undefined, /completedBefore|options/);
      });
    });

    describe('watch', () => {
      it('refuses a listener that is not a function', async () => {
        await refused(() => c.store.watch(bad('listener')), /listener/);
      });
    });
  });
}
