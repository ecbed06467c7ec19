import type { Readable } from 'node:stream';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  makeFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';

/** Guarantees table, row "handler throws", on the embedded defaults. */
describe('guarantees: a handler that throws', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const RETENTION_MS = 60_000;
  const payload = bytes(3_000, 81);

  async function readAll(stream: Readable): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /** A sequence whose handler fails `failures` times, with 3 attempts allowed. */
  async function handledWithFailures(channel: string, failures: number) {
    t = await createSequenceTestApp(channel, {
      retentionMs: RETENTION_MS,
      handler: { handlerRetry: { attempts: 3, baseDelayMs: 1 } },
    });
    t.handler.failNext = failures;
    const fragments = makeFragments('flaky', payload, 1_000);
    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();
    return { app: t, fragments };
  }

  const sample = (app: SequenceTestApp, name: string, labels: Record<string, string>) =>
    metricValue(app.metrics.registry, `nest_sequence_${name}`, labels);

  it('is retried: failing twice then succeeding, it is called 3 times, the sequence is delivered once and acked', async () => {
    const channel = 'guarantees.handler.recovers';
    const { app } = await handledWithFailures(channel, 2);

    expect(app.handler.calls).toBe(3);
    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.of('flaky')[0].bytes.equals(payload)).toBe(true);
    expect(deadLetters(app.transport, channel)).toHaveLength(0);
    expect(app.transport.depth(channel) + app.transport.unsettled(channel)).toBe(0);
    expect(await sample(app, 'handler_failures_total', { channel })).toBe(2);
    expect(await sample(app, 'sequences_completed_total', { channel })).toBe(1);
  });

  it('is called exactly handlerRetry.attempts times when it always fails, then the completing fragment is dead-lettered handler-failed', async () => {
    const channel = 'guarantees.handler.gives-up';
    const { app, fragments } = await handledWithFailures(channel, Number.MAX_SAFE_INTEGER);

    expect(app.handler.calls).toBe(3);
    expect(app.handler.deliveries).toHaveLength(0);
    const dead = deadLetters(app.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^handler-failed: sequence flaky: handler failed 3 time\(s\); last error: handler failure #3/,
    );
    expect(dead[0].headers['x-sequence-position']).toBe(3);
    expect(dead[0].body.equals(fragments[2].body)).toBe(true);
    expect(await sample(app, 'handler_failures_total', { channel })).toBe(3);
    expect(
      await sample(app, 'sequences_rejected_total', { channel, reason: 'handler-failed' }),
    ).toBe(1);
    expect(await sample(app, 'sequences_completed_total', { channel })).toBe(0);
  });

  it("keeps a failed sequence's fragments readable from the store until retentionMs has passed", async () => {
    const channel = 'guarantees.handler.kept';
    const { app } = await handledWithFailures(channel, Number.MAX_SAFE_INTEGER);
    const ref = { scope: channel, sequenceId: 'flaky' };

    expect((await readAll(app.store.read(ref))).equals(payload)).toBe(true);
    expect(await app.store.stats(Date.now())).toMatchObject({
      openSequences: 0,
      bufferedBytes: payload.length,
    });

    await app.sweeper.sweep(Date.now() + RETENTION_MS + 1);

    await expect(readAll(app.store.read(ref))).rejects.toThrow(/no longer held/);
  });

  it('does not hand a failed sequence to the handler again when a late duplicate arrives', async () => {
    const channel = 'guarantees.handler.late-duplicate';
    const { app, fragments } = await handledWithFailures(channel, Number.MAX_SAFE_INTEGER);

    await publishAll(app.transport, channel, [fragments[0]]);
    await app.transport.whenIdle();

    expect(app.handler.calls).toBe(3);
    expect(deadLetters(app.transport, channel)).toHaveLength(1);
    expect(await sample(app, 'duplicate_fragments_total', { channel })).toBe(1);
  });
});
