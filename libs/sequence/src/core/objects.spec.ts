import { definedOnly } from './objects';

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
