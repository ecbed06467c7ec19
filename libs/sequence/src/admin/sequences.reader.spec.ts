import type { OpenSequenceInfo } from '../ports/sequence-store.port';
import { MAX_RANGES, sequenceItem, sequenceView, toRanges } from './sequences.reader';

function info(received: number[], missing: number[]): OpenSequenceInfo {
  return {
    scope: 'images',
    sequenceId: 'study-1',
    receivedPositions: received,
    missingPositions: missing,
    bytes: 0,
    firstFragmentAt: 0,
    lastFragmentAt: 0,
    deadline: 0,
    complete: false,
  };
}

describe('the open sequence the API shows', () => {
  it('gives positions as ranges with their counts, not one by one', () => {
    const view = sequenceView(sequenceItem(info([7, 1, 2, 3, 4], [5, 6]), 0));
    expect(view).toMatchObject({
      received: [
        [1, 4],
        [7, 7],
      ],
      missing: [[5, 6]],
      receivedCount: 5,
      missingCount: 2,
      truncated: false,
    });
    expect(view).not.toHaveProperty('receivedPositions');
    expect(view).not.toHaveProperty('missingPositions');
  });

  it('stays small for 100,000 scattered fragments: ranges capped, counts exact', () => {
    const odd = Array.from({ length: 50_000 }, (_, i) => 2 * i + 1);
    const even = Array.from({ length: 50_000 }, (_, i) => 2 * i + 2);
    const view = sequenceView(sequenceItem(info(odd, even), 0));
    expect(view.received).toHaveLength(MAX_RANGES);
    expect(view.missing).toHaveLength(MAX_RANGES);
    expect(view).toMatchObject({ receivedCount: 50_000, missingCount: 50_000, truncated: true });
    expect(JSON.stringify(view).length).toBeLessThan(20_000);
  });

  it('merges duplicates and unordered positions', () => {
    expect(toRanges([3, 1, 2, 2, 9])).toEqual([
      [1, 3],
      [9, 9],
    ]);
    expect(toRanges([])).toEqual([]);
  });
});
