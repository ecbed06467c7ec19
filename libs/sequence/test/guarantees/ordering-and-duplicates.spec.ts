import { Readable } from 'node:stream';
import { sha256Hex } from '../../src/core/checksum';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  makeFragments,
  metricValue,
  publishAll,
  shuffled,
  type SequenceTestApp,
  type TestFragment,
} from '../support/sequence-test-app';

/**
 * Guarantees table, rows "duplicate fragment", "fragments out of order / interleaved sequences"
 * and "late duplicate after completion", on the embedded defaults.
 */
describe('guarantees: order and duplicates', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const duplicates = (app: SequenceTestApp, channel: string) =>
    metricValue(app.metrics.registry, 'nest_sequence_duplicate_fragments_total', { channel });

  it('delivers a sequence whose fragments arrive in reverse order once, byte-exact', async () => {
    const channel = 'guarantees.order.reversed';
    t = await createSequenceTestApp(channel);
    const payload = bytes(9_500, 1);

    await publishAll(t.transport, channel, makeFragments('reversed', payload, 1_000).reverse());
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    const [delivery] = t.handler.of('reversed');
    expect(delivery.bytes.equals(payload)).toBe(true);
    expect(delivery.payload.fragments).toBe(10);
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('delivers a sequence whose fragments arrive shuffled once, byte-exact', async () => {
    const channel = 'guarantees.order.shuffled';
    t = await createSequenceTestApp(channel);
    const payload = bytes(31_000, 2);
    const fragments = makeFragments('shuffled', payload, 1_000);
    const order = shuffled(fragments, 5);
    expect(order.map((f) => f.headers['x-sequence-position'])).not.toEqual(
      fragments.map((f) => f.headers['x-sequence-position']),
    );

    await publishAll(t.transport, channel, order);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('shuffled')[0].bytes.equals(payload)).toBe(true);
  });

  it('delivers 30 interleaved sequences of varied sizes each once, byte-exact, with their metadata', async () => {
    const channel = 'guarantees.order.interleaved';
    t = await createSequenceTestApp(channel);
    const sequences = Array.from({ length: 30 }, (_, index) => {
      const payload = bytes((index * 7_919) % 20_000, index + 1); // index 0: an empty payload
      const fragmentBytes = 256 + ((index * 131) % 2_000);
      const headers = { tenant: `tenant-${index % 3}`, index, urgent: index % 2 === 0 };
      const sequenceId = `interleaved-${index}`;
      return {
        sequenceId,
        payload,
        headers,
        fragments: makeFragments(sequenceId, payload, fragmentBytes, headers),
      };
    });
    const all: TestFragment[] = shuffled(
      sequences.flatMap((s) => s.fragments),
      17,
    );
    expect(all.length).toBeGreaterThan(100);

    await publishAll(t.transport, channel, all);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(30);
    for (const { sequenceId, payload, headers, fragments } of sequences) {
      const received = t.handler.of(sequenceId);
      expect(received).toHaveLength(1);
      const [{ payload: meta, bytes: body }] = received;
      expect(body.equals(payload)).toBe(true);
      expect(meta.channel).toBe(channel);
      expect(meta.fragments).toBe(fragments.length);
      expect(meta.bytes).toBe(payload.length);
      expect(meta.sha256).toBe(sha256Hex(payload));
      expect(meta.headers).toEqual(headers);
      expect(meta.firstFragmentAt.getTime()).toBeLessThanOrEqual(meta.lastFragmentAt.getTime());
    }
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('delivers what SplitterService sent, with the user headers and content type', async () => {
    const channel = 'guarantees.order.splitter';
    t = await createSequenceTestApp(channel);
    const payload = bytes(50_000, 3);

    const receipt = await t.splitter.send(channel, payload, {
      sequenceId: 'split-1',
      fragmentBytes: 4_096,
      headers: { study: 'CT-1', series: 4 },
      contentType: 'application/dicom',
    });
    await t.transport.whenIdle();

    const [delivery] = t.handler.of('split-1');
    expect(t.handler.calls).toBe(1);
    expect(delivery.bytes.equals(payload)).toBe(true);
    expect(delivery.payload.fragments).toBe(receipt.fragments);
    expect(receipt.fragments).toBe(13);
    expect(delivery.payload.sha256).toBe(receipt.sha256);
    expect(delivery.payload.headers).toEqual({ study: 'CT-1', series: 4 });
    expect(delivery.payload.contentType).toBe('application/dicom');
  });

  it('delivers a stream of unknown length sent by SplitterService (size only on the last fragment)', async () => {
    const channel = 'guarantees.order.stream';
    t = await createSequenceTestApp(channel);
    const payload = bytes(40_000, 4);
    const chunks = Array.from({ length: 40 }, (_, i) =>
      payload.subarray(i * 1_000, (i + 1) * 1_000),
    );

    const receipt = await t.splitter.send(channel, Readable.from(chunks), {
      sequenceId: 'streamed-1',
      fragmentBytes: 3_000,
    });
    await t.transport.whenIdle();

    expect(receipt.fragments).toBe(14);
    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('streamed-1')[0].bytes.equals(payload)).toBe(true);
  });

  it('handles a sequence whose every fragment arrives twice once, and counts each duplicate', async () => {
    const channel = 'guarantees.duplicates.twice';
    t = await createSequenceTestApp(channel);
    const payload = bytes(6_000, 5);
    const fragments = makeFragments('twice', payload, 1_000);

    await publishAll(
      t.transport,
      channel,
      fragments.flatMap((f) => [f, f]),
    );
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('twice')[0].bytes.equals(payload)).toBe(true);
    expect(await duplicates(t, channel)).toBe(6);
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('acks and drops duplicates that arrive after completion: no second delivery, no dead letter', async () => {
    const channel = 'guarantees.duplicates.late';
    t = await createSequenceTestApp(channel);
    const payload = bytes(4_000, 6);
    const fragments = makeFragments('late', payload, 1_000);
    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();
    expect(t.handler.calls).toBe(1);
    expect(await duplicates(t, channel)).toBe(0);

    await publishAll(t.transport, channel, [...fragments].reverse());
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('late')).toHaveLength(1);
    expect(await duplicates(t, channel)).toBe(4);
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
    // Acked, not parked: nothing is left in the queue or in the consumer's hands.
    expect(t.transport.depth(channel)).toBe(0);
    expect(t.transport.unsettled(channel)).toBe(0);
  });
});
