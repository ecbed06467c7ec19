import type { RejectionCode } from 'nest-sequence';
import { crc32, sha256Hex } from '../../src/core/checksum';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  makeFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
  type TestFragment,
} from '../support/sequence-test-app';

/**
 * Guarantees table, rows "fragment fails CRC, bad or contradictory headers, position > size, size
 * changes mid-sequence" and "reassembled SHA-256 mismatch", on the embedded defaults.
 */
describe('guarantees: rejected fragments and sequences', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const MAX_FRAGMENT_BYTES = 1_500;
  const victimPayload = bytes(3_000, 21);
  const bystanderPayload = bytes(2_500, 22);
  /** Positions 1..3 of 1,000 bytes each. */
  const victim = () => makeFragments('victim', victimPayload, 1_000);
  const bystander = () => makeFragments('bystander', bystanderPayload, 1_000);

  /** A copy of `fragment` with headers set (`undefined` removes one) and optionally another body. */
  function altered(
    fragment: TestFragment,
    headers: Record<string, string | number | boolean | undefined>,
    body = fragment.body,
  ): TestFragment {
    const merged: Record<string, string | number | boolean> = { ...fragment.headers };
    for (const [name, value] of Object.entries(headers)) {
      if (value === undefined) delete merged[name];
      else merged[name] = value;
    }
    return { body, headers: merged };
  }

  function fragmentsRejected(app: SequenceTestApp, channel: string, reason: string) {
    return metricValue(app.metrics.registry, 'nest_sequence_fragments_rejected_total', {
      channel,
      reason,
    });
  }

  describe('a fragment whose body fails its CRC-32', () => {
    it('is dead-lettered crc-mismatch while another sequence in flight completes, and a good copy then completes its sequence', async () => {
      const channel = 'guarantees.rejections.crc';
      t = await createSequenceTestApp(channel);
      const [v1, v2, v3] = victim();
      const corrupted = Buffer.from(v2.body);
      corrupted[500] ^= 0x01;
      const [b1, b2, b3] = bystander();

      await publishAll(t.transport, channel, [b1, v1, { ...v2, body: corrupted }, b2, v3, b3]);
      await t.transport.whenIdle();

      const dead = deadLetters(t.transport, channel);
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(/^crc-mismatch: sequence victim fragment 2: /);
      expect(dead[0].body.equals(corrupted)).toBe(true);
      expect(dead[0].headers['x-sequence-id']).toBe('victim');
      expect(t.handler.of('bystander')[0].bytes.equals(bystanderPayload)).toBe(true);
      expect(t.handler.of('victim')).toHaveLength(0);
      expect(await fragmentsRejected(t, channel, 'crc-mismatch')).toBe(1);

      await publishAll(t.transport, channel, [v2]);
      await t.transport.whenIdle();

      expect(t.handler.of('victim')).toHaveLength(1);
      expect(t.handler.of('victim')[0].bytes.equals(victimPayload)).toBe(true);
      expect(t.handler.calls).toBe(2);
      expect(deadLetters(t.transport, channel)).toHaveLength(1);
    });
  });

  interface BadFragmentCase {
    readonly name: string;
    readonly code: RejectionCode;
    readonly bad: (fragments: TestFragment[]) => TestFragment;
  }

  const cases: BadFragmentCase[] = [
    {
      name: 'a non-integer position ("1.5")',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-position': '1.5' }),
    },
    {
      name: 'a negative position',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-position': -2 }),
    },
    {
      name: 'position 0 (positions are 1-based)',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-position': 0 }),
    },
    {
      name: 'a position greater than the size on the same fragment',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-position': 4 }),
    },
    {
      name: 'a position beyond the size earlier fragments declared',
      code: 'position-out-of-range',
      bad: ([, f2]) =>
        altered(f2, {
          'x-sequence-position': 4,
          'x-sequence-size': undefined,
          'x-sequence-bytes': undefined,
        }),
    },
    {
      name: 'a size that changes mid-sequence',
      code: 'size-changed',
      bad: ([, f2]) => altered(f2, { 'x-sequence-size': 4 }),
    },
    {
      name: 'a missing sequence id',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-id': undefined }),
    },
    {
      name: 'a sequence id with forbidden characters',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-id': 'victim/../etc passwd' }),
    },
    {
      name: 'a second "last" fragment at another position',
      code: 'duplicate-last',
      bad: ([, f2, f3]) =>
        altered(f2, {
          'x-sequence-last': true,
          'x-sequence-size': 2,
          'x-sequence-sha256': f3.headers['x-sequence-sha256'],
        }),
    },
    {
      name: 'a missing CRC-32 header',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-fragment-crc32': undefined }),
    },
    {
      name: 'an unsupported wire version',
      code: 'unsupported-version',
      bad: ([, f2]) => altered(f2, { 'x-sequence-version': 2 }),
    },
    {
      name: 'a missing wire version',
      code: 'malformed-header',
      bad: ([, f2]) => altered(f2, { 'x-sequence-version': undefined }),
    },
    {
      name: 'a body larger than maxFragmentBytes',
      code: 'fragment-too-large',
      bad: ([, f2]) => {
        const body = Buffer.concat([f2.body, bytes(MAX_FRAGMENT_BYTES - 999, 23)]);
        return altered(f2, { 'x-fragment-crc32': crc32(body) }, body);
      },
    },
    {
      name: 'another body at a stored position',
      code: 'conflicting-duplicate',
      bad: ([f1]) => {
        const body = bytes(1_000, 24);
        return altered(f1, { 'x-fragment-crc32': crc32(body) }, body);
      },
    },
    {
      name: 'an x-sequence-bytes that differs from the one declared',
      code: 'declaration-changed',
      bad: ([, f2]) => altered(f2, { 'x-sequence-bytes': 4_000 }),
    },
  ];

  describe.each(cases.map((c, index) => ({ ...c, index })))(
    'a fragment with $name',
    ({ code, bad, index }) => {
      it(`is dead-lettered ${code}; other sequences, and its own, are unaffected`, async () => {
        const channel = `guarantees.rejections.case-${index}`;
        t = await createSequenceTestApp(channel, {
          handler: { maxFragmentBytes: MAX_FRAGMENT_BYTES },
        });
        const fragments = victim();
        const badFragment = bad(fragments);
        const [b1, b2, b3] = bystander();
        // Positions 1 and 3 are stored before the bad fragment arrives, position 2 after it.
        const [v1, v2, v3] = fragments;

        await publishAll(t.transport, channel, [b1, v1, v3, b2, badFragment, b3]);
        await t.transport.whenIdle();

        const dead = deadLetters(t.transport, channel);
        expect(dead).toHaveLength(1);
        expect(deathReasonOf(dead[0]).startsWith(`${code}: `)).toBe(true);
        expect(dead[0].body.equals(badFragment.body)).toBe(true);
        expect(await fragmentsRejected(t, channel, code)).toBe(1);
        expect(t.handler.of('bystander')).toHaveLength(1);
        expect(t.handler.of('bystander')[0].bytes.equals(bystanderPayload)).toBe(true);
        expect(t.handler.of('victim')).toHaveLength(0);

        // The bad fragment took nothing from its sequence: the genuine ones complete it.
        await publishAll(t.transport, channel, [v2]);
        await t.transport.whenIdle();

        expect(t.handler.of('victim')).toHaveLength(1);
        expect(t.handler.of('victim')[0].bytes.equals(victimPayload)).toBe(true);
        expect(t.handler.calls).toBe(2);
        expect(deadLetters(t.transport, channel)).toHaveLength(1);
      });
    },
  );

  describe('a sequence whose reassembled payload does not match its declaration', () => {
    it('is not handed to the handler when its SHA-256 differs from x-sequence-sha256; the completing fragment is dead-lettered integrity-mismatch', async () => {
      const channel = 'guarantees.rejections.sha256';
      t = await createSequenceTestApp(channel);
      const payload = bytes(5_000, 25);
      const fragments = makeFragments('forged', payload, 1_000);
      const last = fragments[4];
      fragments[4] = altered(last, { 'x-sequence-sha256': sha256Hex(bytes(5_000, 26)) });
      const [b1, b2, b3] = bystander();

      await publishAll(t.transport, channel, [b1, ...fragments, b2, b3]);
      await t.transport.whenIdle();

      expect(t.handler.of('forged')).toHaveLength(0);
      expect(t.handler.calls).toBe(1); // the bystander only
      const dead = deadLetters(t.transport, channel);
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(/^integrity-mismatch: /);
      expect(deathReasonOf(dead[0])).toContain('forged');
      expect(dead[0].headers['x-sequence-position']).toBe(5);
      expect(dead[0].body.equals(last.body)).toBe(true);
      const registry = t.metrics.registry;
      expect(
        await metricValue(registry, 'nest_sequence_sequences_rejected_total', {
          channel,
          reason: 'integrity-mismatch',
        }),
      ).toBe(1);
      expect(
        await metricValue(registry, 'nest_sequence_sequences_completed_total', { channel }),
      ).toBe(1);
    });

    it('is not handed to the handler when its byte count differs from x-sequence-bytes', async () => {
      const channel = 'guarantees.rejections.bytes';
      t = await createSequenceTestApp(channel);
      const payload = bytes(4_000, 27);
      const fragments = makeFragments('short', payload, 1_000).map((f) =>
        altered(f, { 'x-sequence-bytes': 4_500 }),
      );

      await publishAll(t.transport, channel, fragments);
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(0);
      const dead = deadLetters(t.transport, channel);
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(/^integrity-mismatch: /);
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_sequences_rejected_total', {
          channel,
          reason: 'integrity-mismatch',
        }),
      ).toBe(1);
    });
  });
});
