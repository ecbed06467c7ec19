import type {
  AcceptResult,
  FragmentRecord,
  SequenceRef,
  SequenceStore,
} from '../../../ports/sequence-store.port';

/** What the open-sequence cases need of the sequence-store suite. */
export interface OpenSequenceCaseContext {
  store(): SequenceStore;
  scope(): string;
  t0(): number;
  accept(fragment: FragmentRecord, at?: number): Promise<AcceptResult>;
  /** Fragments of a payload cut into `bodies` (size declared on each), under `scope`. */
  fixture(scope: string, bodies: string[]): { ref: SequenceRef; fragments: FragmentRecord[] };
  finish(ref: SequenceRef, at?: number): Promise<boolean>;
}

/** `listOpen` and `inspect`, for the stores that offer them (the operator console's reads). */
export function describeOpenSequenceCases(c: OpenSequenceCaseContext): void {
  describe('listOpen and inspect', () => {
    function reads(store: SequenceStore) {
      const { listOpen, inspect } = store;
      if (!listOpen || !inspect) throw new Error(`${store.name} lacks listOpen or inspect`);
      return { listOpen: listOpen.bind(store), inspect: inspect.bind(store) };
    }

    it('inspects an open sequence: received and missing positions, bytes, times', async () => {
      const { inspect } = reads(c.store());
      const { ref, fragments } = c.fixture(c.scope(), ['aa', 'bbb', 'c', 'dd']);
      await c.accept(fragments[2], c.t0());
      await c.accept(fragments[0], c.t0() + 10);

      expect(await inspect(ref, c.t0() + 20)).toEqual({
        scope: ref.scope,
        sequenceId: ref.sequenceId,
        receivedPositions: [1, 3],
        missingPositions: [2, 4],
        size: 4,
        bytes: 3,
        declaredBytes: 8,
        firstFragmentAt: c.t0(),
        lastFragmentAt: c.t0() + 10,
        deadline: c.t0() + 60_000,
        complete: false,
        leaseHolder: undefined,
      });
    });

    it('names the holder of a live completion lease, and no one once it lapsed', async () => {
      const { inspect } = reads(c.store());
      const { ref, fragments } = c.fixture(c.scope(), ['a', 'b']);
      await c.accept(fragments[0], c.t0());
      expect(await c.accept(fragments[1], c.t0())).toMatchObject({ status: 'complete' });

      expect(await inspect(ref, c.t0() + 1)).toMatchObject({
        complete: true,
        missingPositions: [],
        leaseHolder: 'consumer-a',
      });
      expect((await inspect(ref, c.t0() + 30_001))?.leaseHolder).toBeUndefined();
    });

    it('answers undefined for a sequence that is not open: finished, or never seen', async () => {
      const { inspect } = reads(c.store());
      const { ref, fragments } = c.fixture(c.scope(), ['a']);
      await c.accept(fragments[0], c.t0());
      await c.finish(ref, c.t0());

      await expect(inspect(ref, c.t0() + 1)).resolves.toBeUndefined();
      await expect(
        inspect({ scope: c.scope(), sequenceId: 'never-seen' }, c.t0()),
      ).resolves.toBeUndefined();
    });

    it('lists open sequences earliest deadline first, at most limit, of one scope if asked', async () => {
      const { listOpen } = reads(c.store());
      const other = `${c.scope()}.other`;
      const first = c.fixture(c.scope(), ['a', 'b']);
      const second = c.fixture(other, ['a', 'b']);
      const third = c.fixture(c.scope(), ['a', 'b']);
      await c.accept(first.fragments[0], c.t0());
      await c.accept(second.fragments[0], c.t0() + 1);
      await c.accept(third.fragments[1], c.t0() + 2);
      const ids = (infos: { sequenceId: string }[]) => infos.map((info) => info.sequenceId);
      const now = c.t0() + 3;

      const all = await listOpen({ limit: 10, now });
      expect(ids(all)).toEqual([first.ref.sequenceId, second.ref.sequenceId, third.ref.sequenceId]);
      expect(ids(await listOpen({ limit: 2, now }))).toEqual(ids(all).slice(0, 2));
      expect(ids(await listOpen({ scope: c.scope(), limit: 10, now }))).toEqual([
        first.ref.sequenceId,
        third.ref.sequenceId,
      ]);
      expect(ids(await listOpen({ scope: c.scope(), limit: 1, now }))).toEqual([
        first.ref.sequenceId,
      ]);
      const [listedThird] = await listOpen({ scope: c.scope(), limit: 10, now }).then((infos) =>
        infos.filter((info) => info.sequenceId === third.ref.sequenceId),
      );
      expect(listedThird).toMatchObject({ receivedPositions: [2], missingPositions: [1] });
    });

    it('lists nothing once every sequence finished', async () => {
      const { listOpen } = reads(c.store());
      const { ref, fragments } = c.fixture(c.scope(), ['a']);
      await c.accept(fragments[0], c.t0());
      await c.finish(ref, c.t0());
      await expect(listOpen({ scope: c.scope(), limit: 10, now: c.t0() + 1 })).resolves.toEqual([]);
    });
  });
}
