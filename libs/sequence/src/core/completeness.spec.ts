import {
  accountedBytes,
  admitFragment,
  budgetIncrease,
  emptySequenceState,
  FRAGMENT_OVERHEAD_BYTES,
  isComplete,
  missingPositions,
  recordFragment,
  reservedAhead,
  SEQUENCE_OVERHEAD_BYTES,
  storedCharge,
  userHeaderBytes,
  type AdmissionLimits,
  type FragmentFacts,
  type SequenceState,
} from './completeness';

const limits: AdmissionLimits = { maxSequenceBytes: 1000, maxFragments: 10 };
const SHA_A = 'a'.repeat(64);
const SHA_B = 'b'.repeat(64);

function facts(position: number, extra: Partial<FragmentFacts> = {}): FragmentFacts {
  return { position, last: false, crc32: 100 + position, bodyBytes: 10, ...extra };
}

/** The last fragment of a sequence of `size` fragments. */
function lastOf(size: number, extra: Partial<FragmentFacts> = {}): FragmentFacts {
  return facts(size, { size, last: true, sha256: SHA_A, ...extra });
}

function stateWith(...fragments: FragmentFacts[]): SequenceState {
  const state = emptySequenceState(0);
  fragments.forEach((fragment, index) => {
    expect(admitFragment(state, fragment, limits)).toEqual({ kind: 'new' });
    recordFragment(state, fragment, index);
  });
  return state;
}

function snapshot(state: SequenceState): unknown {
  return { ...state, crcByPosition: [...state.crcByPosition] };
}

describe('admitFragment', () => {
  it('admits the first fragment of an empty sequence as new', () => {
    expect(admitFragment(emptySequenceState(0), facts(1, { size: 3 }), limits)).toEqual({
      kind: 'new',
    });
  });

  it('calls a stored position with the same crc32 a duplicate', () => {
    const state = stateWith(facts(1, { size: 3 }));
    expect(admitFragment(state, facts(1, { size: 3 }), limits)).toEqual({ kind: 'duplicate' });
  });

  it('calls the last fragment stored again a duplicate', () => {
    const state = stateWith(lastOf(3));
    expect(admitFragment(state, lastOf(3), limits)).toEqual({ kind: 'duplicate' });
  });

  describe('contradictions', () => {
    type Case = [name: string, code: string, state: SequenceState, fragment: FragmentFacts];
    const cases: Case[] = [
      [
        'a stored position with another crc32',
        'conflicting-duplicate',
        stateWith(facts(1, { size: 3 })),
        facts(1, { size: 3, crc32: 999 }),
      ],
      ['another size', 'size-changed', stateWith(facts(1, { size: 3 })), facts(2, { size: 4 })],
      [
        'a position beyond the declared size',
        'position-out-of-range',
        stateWith(facts(1, { size: 3 })),
        facts(4),
      ],
      [
        'a position beyond the known last position (streamed)',
        'position-out-of-range',
        stateWith(facts(1), lastOf(3)),
        facts(4),
      ],
      [
        'a size below a stored position (streamed)',
        'position-out-of-range',
        stateWith(facts(1), facts(5)),
        lastOf(3),
      ],
      [
        'a second last fragment at another position',
        'duplicate-last',
        stateWith(lastOf(3)),
        lastOf(2),
      ],
      [
        'other declared bytes',
        'declaration-changed',
        stateWith(facts(1, { bytes: 30 })),
        facts(2, { bytes: 31 }),
      ],
      [
        'another sha256',
        'declaration-changed',
        stateWith(facts(1, { sha256: SHA_A })),
        lastOf(3, { sha256: SHA_B }),
      ],
      [
        'a body that takes the stored bytes past the declared bytes',
        'declaration-changed',
        stateWith(facts(1, { bytes: 25 })),
        facts(2, { bytes: 25, bodyBytes: 16 }),
      ],
      [
        'a first body larger than the bytes it declares',
        'declaration-changed',
        emptySequenceState(0),
        facts(1, { bytes: 9 }),
      ],
      [
        'declared bytes below what is already stored',
        'declaration-changed',
        stateWith(facts(1), facts(2)),
        facts(3, { bytes: 25 }),
      ],
      [
        'another content-type',
        'declaration-changed',
        stateWith(facts(1, { contentType: 'application/json' })),
        facts(2, { contentType: 'application/xml' }),
      ],
      [
        'another content-encoding',
        'declaration-changed',
        stateWith(facts(1, { contentEncoding: 'gzip' })),
        facts(2, { contentEncoding: 'br' }),
      ],
      [
        'another content-type than a fragment after one that carried none',
        'declaration-changed',
        stateWith(facts(1), facts(2, { contentType: 'application/json' }), facts(3)),
        facts(4, { contentType: 'text/plain' }),
      ],
      [
        'another content-type at a stored position (before calling it a duplicate)',
        'declaration-changed',
        stateWith(facts(1, { contentType: 'application/json' })),
        facts(1, { contentType: 'text/plain' }),
      ],
    ];

    it.each(cases)(
      'rejects %s as %s, leaving the state as it was',
      (_name, code, state, fragment) => {
        const before = snapshot(state);
        const admission = admitFragment(state, fragment, limits);
        expect(admission).toMatchObject({ kind: 'contradiction', code });
        expect(admission.kind === 'contradiction' && admission.detail.length).toBeGreaterThan(0);
        expect(snapshot(state)).toEqual(before);
      },
    );

    it('admits a fragment that carries no content-type or content-encoding, or the same ones', () => {
      const state = stateWith(
        facts(1, { contentType: 'application/json', contentEncoding: 'gzip' }),
      );
      expect(admitFragment(state, facts(2), limits)).toEqual({ kind: 'new' });
      expect(admitFragment(state, facts(2, { contentType: 'application/json' }), limits)).toEqual({
        kind: 'new',
      });
      expect(admitFragment(state, facts(2, { contentEncoding: 'gzip' }), limits)).toEqual({
        kind: 'new',
      });
      // Compared as they are written: another spelling is another declaration.
      expect(
        admitFragment(state, facts(2, { contentType: 'Application/JSON' }), limits),
      ).toMatchObject({ kind: 'contradiction', code: 'declaration-changed' });
    });

    it('admits a body that brings the stored bytes to exactly the declared bytes', () => {
      const state = stateWith(facts(1, { bytes: 25 }));
      expect(admitFragment(state, facts(2, { bytes: 25, bodyBytes: 15 }), limits)).toEqual({
        kind: 'new',
      });
    });

    it('calls a stored fragment a duplicate before counting its body against the declared bytes', () => {
      const state = stateWith(facts(1, { bytes: 20 }), facts(2, { bytes: 20 }));
      expect(admitFragment(state, facts(2, { bytes: 20 }), limits)).toEqual({ kind: 'duplicate' });
      expect(admitFragment(state, facts(2, { bytes: 20, crc32: 999 }), limits)).toMatchObject({
        code: 'conflicting-duplicate',
      });
    });

    it('prefers a contradiction over a duplicate at a stored position', () => {
      const state = stateWith(facts(1, { size: 3 }));
      expect(admitFragment(state, facts(1, { size: 4 }), limits)).toMatchObject({
        code: 'size-changed',
      });
    });
  });

  describe('limits', () => {
    it('rejects a declared size over maxFragments', () => {
      expect(admitFragment(emptySequenceState(0), facts(1, { size: 11 }), limits)).toMatchObject({
        kind: 'limit',
        code: 'too-many-fragments',
      });
    });

    it('rejects a position over maxFragments in a streamed sequence', () => {
      expect(admitFragment(stateWith(facts(1)), facts(11), limits)).toMatchObject({
        kind: 'limit',
        code: 'too-many-fragments',
      });
    });

    it('admits exactly maxFragments fragments', () => {
      expect(admitFragment(emptySequenceState(0), lastOf(10), limits)).toEqual({ kind: 'new' });
    });

    it('rejects declared bytes over maxSequenceBytes', () => {
      expect(admitFragment(emptySequenceState(0), facts(1, { bytes: 1001 }), limits)).toMatchObject(
        { kind: 'limit', code: 'sequence-too-large' },
      );
    });

    it('rejects a body that takes the stored bytes over maxSequenceBytes', () => {
      const state = stateWith(facts(1, { bodyBytes: 600 }));
      expect(admitFragment(state, facts(2, { bodyBytes: 401 }), limits)).toMatchObject({
        kind: 'limit',
        code: 'sequence-too-large',
      });
      expect(admitFragment(state, facts(2, { bodyBytes: 400 }), limits)).toEqual({ kind: 'new' });
    });

    it('never rejects a duplicate for a limit', () => {
      const state = stateWith(facts(1, { bodyBytes: 1000 }));
      expect(admitFragment(state, facts(1, { bodyBytes: 1000 }), limits)).toEqual({
        kind: 'duplicate',
      });
    });
  });
});

describe('recordFragment', () => {
  it('remembers declarations, positions, bytes and times', () => {
    const state = emptySequenceState(5);
    recordFragment(state, facts(2, { bytes: 30 }), 7);
    recordFragment(state, lastOf(3), 9);
    expect(state).toEqual({
      size: 3,
      lastPosition: 3,
      declaredBytes: 30,
      sha256: SHA_A,
      crcByPosition: new Map([
        [2, 102],
        [3, 103],
      ]),
      highestPosition: 3,
      storedBytes: 20,
      headerBytes: 0,
      firstFragmentAt: 5,
      lastFragmentAt: 9,
    });
  });

  it('keeps the first content-type and content-encoding a fragment carried', () => {
    const state = emptySequenceState(0);
    recordFragment(state, facts(1), 1);
    expect([state.contentType, state.contentEncoding]).toEqual([undefined, undefined]);
    recordFragment(state, facts(2, { contentType: 'application/json' }), 2);
    recordFragment(state, facts(3, { contentEncoding: 'gzip' }), 3);
    recordFragment(state, facts(4), 4);
    expect(state).toMatchObject({ contentType: 'application/json', contentEncoding: 'gzip' });
  });
});

describe('isComplete', () => {
  it('is false while the size is unknown', () => {
    expect(isComplete(stateWith(facts(1), facts(2)))).toBe(false);
  });

  it('is false while a position is missing', () => {
    expect(isComplete(stateWith(facts(1), lastOf(3)))).toBe(false);
  });

  it('is true once every position up to the size is stored, in any order', () => {
    expect(isComplete(stateWith(lastOf(3), facts(1), facts(2)))).toBe(true);
  });
});

describe('missingPositions', () => {
  it('lists gaps up to the size when it is known', () => {
    expect(missingPositions([3, 1], 5)).toEqual([2, 4, 5]);
  });

  it('lists gaps up to the highest received when the size is unknown', () => {
    expect(missingPositions([1, 4])).toEqual([2, 3]);
  });

  it('is empty when nothing is missing or nothing is known', () => {
    expect(missingPositions([1, 2], 2)).toEqual([]);
    expect(missingPositions([])).toEqual([]);
  });
});

describe('budget', () => {
  /** The fixed part of a sequence of `fragments` fragments and `headerBytes` of headers. */
  const overhead = (fragments: number, headerBytes = 0): number =>
    SEQUENCE_OVERHEAD_BYTES + headerBytes + fragments * FRAGMENT_OVERHEAD_BYTES;

  it('charges every sequence and every fragment a fixed overhead, empty ones included', () => {
    expect(accountedBytes(undefined)).toBe(0);
    const empty = stateWith(facts(1, { bodyBytes: 0 }), facts(2, { bodyBytes: 0 }));
    expect(accountedBytes(empty)).toBe(overhead(2));
    expect(accountedBytes(empty)).toBeGreaterThan(2 * FRAGMENT_OVERHEAD_BYTES);
    expect(accountedBytes(stateWith(facts(1), facts(2)))).toBe(overhead(2) + 20);
  });

  it('charges the headers a sequence keeps: those of the fragment that opened it', () => {
    const state = stateWith(facts(1, { headerBytes: 300 }), facts(2, { headerBytes: 900 }));
    expect(state.headerBytes).toBe(300);
    expect(accountedBytes(state)).toBe(overhead(2, 300) + 20);
    expect(userHeaderBytes({ 'x-study': 'é' })).toBe(Buffer.byteLength('{"x-study":"é"}'));
  });

  it('reserves the declared bytes and fragments from the first fragment that declares them', () => {
    const opened = stateWith(facts(1, { size: 4, bytes: 1000 }));
    expect(accountedBytes(opened)).toBe(overhead(4) + 1000);
    expect(storedCharge(opened)).toBe(overhead(1) + 10);
    expect(reservedAhead(opened)).toBe(3 * FRAGMENT_OVERHEAD_BYTES + 990);
  });

  it('needs the whole reservation to open a sequence that declares its bytes and size', () => {
    expect(budgetIncrease(undefined, facts(1, { size: 4, bytes: 50 }))).toBe(overhead(4) + 50);
    expect(budgetIncrease(undefined, facts(1, { bytes: 5 }))).toBe(overhead(1) + 10);
  });

  it('needs nothing more for a sequence that reserved its declared bytes and size', () => {
    expect(budgetIncrease(stateWith(facts(1, { size: 3, bytes: 50 })), facts(2))).toBe(0);
  });

  it('needs the body and its overhead for a sequence that declared nothing', () => {
    expect(budgetIncrease(stateWith(facts(1)), facts(2, { bodyBytes: 7 }))).toBe(
      7 + FRAGMENT_OVERHEAD_BYTES,
    );
  });

  it('reserves the rest of the declared bytes when a later fragment declares them', () => {
    expect(budgetIncrease(stateWith(facts(1)), facts(2, { bytes: 50 }))).toBe(
      40 + FRAGMENT_OVERHEAD_BYTES,
    );
  });
});
