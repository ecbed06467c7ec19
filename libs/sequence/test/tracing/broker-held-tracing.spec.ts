import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SpanStatusCode } from '@opentelemetry/api';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  firstFragment,
  makeFragments,
  publishHeld,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { useInMemoryTracing } from './in-memory-tracing';

const PARTITIONS = 2;

/**
 * Broker-held reassembly's `receive` spans tell each fragment's fate as the receive ended: a
 * fragment taken into its held sequence (settled later, with the sequence) as `ack`, a refused
 * one as `dead-letter`, with status ERROR.
 */
describe('tracing: broker-held reassembly', () => {
  const tracing = useInMemoryTracing();
  let t: SequenceTestApp | undefined;
  let spoolDir: string | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
    if (spoolDir) rmSync(spoolDir, { recursive: true, force: true });
  });

  async function app(channel: string): Promise<SequenceTestApp> {
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-tracing-'));
    t = await createSequenceTestApp(channel, {
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir: spoolDir } },
    });
    return t;
  }

  const receives = () =>
    tracing.moduleSpans().filter((span) => span.name.startsWith('receive held.'));

  it('records a first fragment refused as a contradiction as dead-lettered', async () => {
    const channel = 'held.traced-refusal';
    const { transport } = await app(channel);
    // Its body alone passes the bytes it declares for the whole sequence.
    await publishHeld(transport, channel, [firstFragment('traced-refused', 2, 10)], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 1, 'dead-lettered');
    await eventually(() => receives().length === 1, 'the receive span ended');

    const [span] = receives();
    expect(span.attributes['nest_sequence.disposition']).toBe('dead-letter');
    expect(span.status.code).toBe(SpanStatusCode.ERROR);
  });

  it('records fragments taken into a held sequence as acked', async () => {
    const channel = 'held.traced-hold';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('traced-held', bytes(2_000, 3), 1_000);
    await publishHeld(transport, channel, fragments, PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    await eventually(() => receives().length === 2, 'both receive spans ended');

    expect(receives().map((span) => span.attributes['nest_sequence.disposition'])).toEqual([
      'ack',
      'ack',
    ]);
  });
});
