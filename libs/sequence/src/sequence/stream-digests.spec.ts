import { createHash } from 'node:crypto';
import { StreamDigests } from './stream-digests';

const sha256 = (...parts: string[]) =>
  createHash('sha256')
    .update(Buffer.from(parts.join('')))
    .digest('hex');

describe('StreamDigests', () => {
  const feedAll = (digests: StreamDigests, id: string, parts: string[]) =>
    parts.forEach((part, i) => digests.feed(id, i + 1, Buffer.from(part)));

  it('matches a sequence it saw whole, and reports one it did not as unverifiable', () => {
    const digests = new StreamDigests(10);
    feedAll(digests, 'a', ['ab', 'cd']);
    expect(digests.check('a', 2, { sha256: sha256('abcd'), bytes: 4 })).toEqual({
      kind: 'matched',
    });
    digests.feed('b', 2, Buffer.from('cd'));
    expect(digests.check('b', 2, { sha256: sha256('abcd') })).toEqual({ kind: 'unverifiable' });
  });

  describe('after a rejected last fragment', () => {
    const wrong = sha256('something else');
    let digests: StreamDigests;

    beforeEach(() => {
      digests = new StreamDigests(10);
      feedAll(digests, 's', ['ab', 'cd']);
      expect(digests.check('s', 2, { sha256: wrong })).toMatchObject({ kind: 'mismatch' });
      expect(digests.markRejected('s', 2, wrong)).toBe(true);
    });

    it('gives the same fragment coming back the same verdict, marked once', () => {
      digests.feed('s', 2, Buffer.from('cd'));
      expect(digests.check('s', 2, { sha256: wrong })).toMatchObject({ kind: 'mismatch' });
      expect(digests.markRejected('s', 2, wrong)).toBe(false);
    });

    it('checks a new sequence under the same id afresh from its first fragment', () => {
      feedAll(digests, 's', ['xy', 'cd']);
      expect(digests.check('s', 2, { sha256: sha256('xycd') })).toEqual({ kind: 'matched' });
    });

    it('does not hold the end of another sequence under the same id to the rejected one', () => {
      digests.feed('s', 2, Buffer.from('cd'));
      expect(digests.check('s', 2, { sha256: sha256('zzcd') })).toEqual({ kind: 'unverifiable' });
    });
  });
});
