import { definedOnly, rememberRecent, rememberRecentEntry } from './objects';

describe('definedOnly', () => {
  it('drops undefined entries, so spreading it keeps the defaults they would have erased', () => {
    const defaults = { prefetch: 16, queueType: 'classic' };
    const options = { prefetch: undefined, queueType: 'quorum' };

    expect(definedOnly(options)).toEqual({ queueType: 'quorum' });
    expect({ ...defaults, ...definedOnly(options) }).toEqual({ prefetch: 16, queueType: 'quorum' });
  });

  it('keeps falsy values that are not undefined', () => {
    expect(definedOnly({ a: 0, b: '', c: false, d: null })).toEqual({
      a: 0,
      b: '',
      c: false,
      d: null,
    });
  });
});

describe('rememberRecent', () => {
  it('keeps the latest values, the one added again counting as newest', () => {
    const recent = new Set<string>();
    for (const value of ['a', 'b', 'c']) rememberRecent(recent, value, 3);
    rememberRecent(recent, 'a', 3);
    rememberRecent(recent, 'd', 3);
    expect([...recent]).toEqual(['c', 'a', 'd']);
  });
});

describe('rememberRecentEntry', () => {
  it('keeps the latest keys with their latest values, a key set again counting as newest', () => {
    const recent = new Map<string, number>();
    for (const [key, value] of [
      ['a', 1],
      ['b', 2],
      ['c', 3],
    ] as const) {
      rememberRecentEntry(recent, key, value, 3);
    }
    rememberRecentEntry(recent, 'a', 4, 3);
    rememberRecentEntry(recent, 'd', 5, 3);
    expect([...recent]).toEqual([
      ['c', 3],
      ['a', 4],
      ['d', 5],
    ]);
  });
});
