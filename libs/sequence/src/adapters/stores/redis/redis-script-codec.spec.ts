import { interpretAccept } from './redis-script-codec';

describe('interpretAccept', () => {
  const ref = { scope: 'codec', sequenceId: 'seq-1' };
  /** A `complete` answer of the accept script, up to lastAt (see lua/accept-5.lua). */
  const complete = ['complete', [], 0, 0, 2, 6, 'ab'.repeat(32), 6, false, false, '{}', 10, 20];

  it.each([
    ['1: this call stored the body', [...complete, 1], true],
    ['0: a copy that took the sequence over', [...complete, 0], false],
    ['absent, as from the script of an older version', complete, false],
  ])('reads the stored flag %s', (_name, reply, stored) => {
    expect(interpretAccept(reply, ref)).toMatchObject({
      kind: 'result',
      result: { status: 'complete', opened: false, stored, sequence: { fragments: 2, bytes: 6 } },
    });
  });
});
