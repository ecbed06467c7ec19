import { storedChargeOf } from 'nest-sequence/testing';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { AggregatorService, MemorySequenceStore, type ReassembledPayload } from 'nest-sequence';
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
      handler: { handlerRetry: { attempts: 3, baseDelayMs: 1 } },
      sequence: { retentionMs: RETENTION_MS },
    });
    t.handler.failNext = failures;
    const fragments = makeFragments('flaky', payload, 1_000);
    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();
    return { app: t, fragments };
  }

  const sample = (app: SequenceTestApp, name: string, labels: Record<string, string>) =>
    metricValue(app.metrics.registry, `nest_sequence_${name}`, labels);

  it.each([
    ['in order (verified at intake)', false],
    ['out of order (verified by reading it back)', true],
  ])(
    "whose own pipeline destination fails, %s: a handler failure (retried, then handler-failed), not the store's",
    async (_how, reversed) => {
      const channel = `guarantees.handler.destination-fails.${String(reversed)}`;
      t = await createSequenceTestApp(channel, {
        handler: { handlerRetry: { attempts: 2, baseDelayMs: 1 } },
        sequence: { retentionMs: RETENTION_MS },
      });
      // The documented pattern into a destination that fails (a full disk): pipeline destroys
      // the payload's stream with the destination's error.
      t.handler.onCall = async (payload) => {
        const full = new Writable({
          write: (_chunk, _encoding, callback) => callback(new Error('ENOSPC: no space left')),
        });
        await pipeline(payload.stream(), full);
      };
      const fragments = makeFragments('to-disk', payload, 500);
      await publishAll(t.transport, channel, reversed ? [...fragments].reverse() : fragments);
      await t.transport.whenIdle();

      // Before, out of order, the error was taken for a store read failure: no retry, the
      // completing fragment requeued, and the redelivery failing the same way, forever.
      expect(t.handler.calls).toBe(2);
      const dead = deadLetters(t.transport, channel);
      expect(dead.map(deathReasonOf)).toEqual([
        expect.stringMatching(
          /^handler-failed: sequence to-disk: handler failed 2 time\(s\); last error: ENOSPC/,
        ),
      ]);
    },
  );

  it('that returned with a stream left to read later: the stream is closed, no uncaught error', async () => {
    const channel = 'guarantees.handler.left-stream';
    t = await createSequenceTestApp(channel, {});
    const left: Readable[] = [];
    // Handed on to be read later, with nobody listening for its errors: read once the sequence
    // is completed and its bodies deleted, it would fail with an uncaught 'error'.
    t.handler.onCall = async (payload) => {
      const stream = payload.stream();
      left.push(stream);
      stream.pause();
      setTimeout(() => stream.resume(), 50);
    };
    await publishAll(t.transport, channel, makeFragments('left', payload, 1_000));
    await t.transport.whenIdle();
    await new Promise((resolve) => setTimeout(resolve, 150));

    expect(t.handler.deliveries).toHaveLength(1);
    expect(left).toHaveLength(1);
    expect(left[0].destroyed).toBe(true);
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

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
      bufferedBytes: storedChargeOf(1_000, 1_000, 1_000),
    });

    await app.sweeper.sweep(Date.now() + RETENTION_MS + 1);

    await expect(readAll(app.store.read(ref))).rejects.toThrow(/no longer held/);
  });

  it('does not hand a failed sequence to the handler again when a late duplicate arrives; the duplicate is dead-lettered with the failure', async () => {
    const channel = 'guarantees.handler.late-duplicate';
    const { app, fragments } = await handledWithFailures(channel, Number.MAX_SAFE_INTEGER);

    await publishAll(app.transport, channel, [fragments[0]]);
    await app.transport.whenIdle();

    expect(app.handler.calls).toBe(3);
    // Had the completing fragment's dead letter failed, this is how its record would still land.
    const [failure, late] = deadLetters(app.transport, channel);
    expect(late.headers['x-death-reason']).toBe(failure.headers['x-death-reason']);
    expect(late.body.equals(fragments[0].body)).toBe(true);
    // Dead-lettered, not dropped: counted as a rejected fragment with the failure's code.
    expect(await sample(app, 'duplicate_fragments_total', { channel })).toBe(0);
    expect(
      await sample(app, 'fragments_rejected_total', { channel, reason: 'handler-failed' }),
    ).toBe(1);
  });

  describe('whose store read failed and who returned all the same', () => {
    /** A memory store whose first read fails after its first chunk (an outage mid-read). */
    function storeFailingFirstRead() {
      const store = new MemorySequenceStore();
      const read = store.read.bind(store);
      let reads = 0;
      store.read = (ref) => {
        const source = read(ref);
        if (++reads > 1) return source;
        return Readable.from(
          (async function* () {
            for await (const chunk of source) {
              yield chunk as Buffer;
              throw new Error('simulated: the store stopped answering');
            }
          })(),
        );
      };
      return store;
    }

    /** Hands the sequence's fragments to `handler` through a consumer of its own. */
    async function deliverTo(
      channel: string,
      handler: (payload: ReassembledPayload) => Promise<void>,
    ) {
      t = await createSequenceTestApp(`${channel}.unused`, {
        sequence: { store: storeFailingFirstRead(), retentionMs: RETENTION_MS },
      });
      const aggregator = t.app.get(AggregatorService);
      const consumer = aggregator.createConsumer(channel, handler);
      const dispositions = [];
      for (const fragment of makeFragments('partial', payload, 1_000)) {
        dispositions.push(
          await aggregator.receive({ ...fragment, channel, redelivered: false }, consumer),
        );
      }
      return { app: t, aggregator, consumer, dispositions };
    }

    it('is handed the sequence back, not completed: its fragments stay, and the next delivery reads them whole', async () => {
      const channel = 'guarantees.handler.swallowed-read-error';
      const got: Buffer[] = [];
      const { app, aggregator, consumer, dispositions } = await deliverTo(
        channel,
        async (delivered) => {
          // Catches its read error and returns normally, having kept part of the bytes.
          got.push(await delivered.toBuffer().catch(() => Buffer.alloc(0)));
        },
      );

      expect(dispositions.at(-1)).toMatchObject({ action: 'requeue' });
      expect(await sample(app, 'sequences_completed_total', { channel })).toBe(0);
      // The redelivered completing fragment: the store answers now.
      const [last] = makeFragments('partial', payload, 1_000).slice(-1);
      expect(await aggregator.receive({ ...last, channel, redelivered: true }, consumer)).toEqual({
        action: 'ack',
      });
      expect(got).toHaveLength(2);
      expect(got[1].equals(payload)).toBe(true);
      expect(await sample(app, 'sequences_completed_total', { channel })).toBe(1);
    });

    it('completes when it read the payload whole on a second stream()', async () => {
      const channel = 'guarantees.handler.read-again';
      let whole: Buffer | undefined;
      const { app, dispositions } = await deliverTo(channel, async (delivered) => {
        await delivered.toBuffer().catch(() => undefined); // failed: the store's outage
        whole = await delivered.toBuffer(); // the store answers again: every byte, checked
      });

      expect(whole?.equals(payload)).toBe(true);
      expect(dispositions.at(-1)).toEqual({ action: 'ack' });
      expect(await sample(app, 'sequences_completed_total', { channel })).toBe(1);
    });
  });
});

/**
 * A memory store whose next `finish` calls fail, as one command does when the store blips: before
 * writing anything, or (`afterWrite`) once written, the reply lost.
 */
class FinishBlipStore extends MemorySequenceStore {
  failNextFinishes = 0;
  afterWrite = false;
  finishCalls = 0;

  override async finish(
    ...args: Parameters<MemorySequenceStore['finish']>
  ): ReturnType<MemorySequenceStore['finish']> {
    this.finishCalls++;
    const written = this.afterWrite ? await super.finish(...args) : undefined;
    if (this.failNextFinishes > 0) {
      this.failNextFinishes--;
      throw new Error('injected fault: the store did not answer this one call');
    }
    return written ?? super.finish(...args);
  }
}

/**
 * The store fails to record a handled sequence's outcome for a moment: the handler is not run
 * again (message-sequence.md, "At-least-once window": only a crash, or a store away longer than
 * the lease, may run it twice).
 */
describe('guarantees: a store blip after the handler ran', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('records the completion once the store answers, without calling the handler again', async () => {
    const channel = 'guarantees.handler.finish-blip';
    const store = new FinishBlipStore();
    t = await createSequenceTestApp(channel, { sequence: { store } });
    store.failNextFinishes = 2;
    const payload = bytes(3_000, 91);
    await publishAll(t.transport, channel, makeFragments('blip', payload, 1_000));
    await t.transport.whenIdle();

    expect(store.finishCalls).toBe(3);
    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('blip')[0].bytes.equals(payload)).toBe(true);
    expect(deadLetters(t.transport, channel)).toEqual([]);
    expect(t.transport.unsettled(channel)).toBe(0);
  });

  it('counts a completion whose marker went in although its reply was lost', async () => {
    const channel = 'guarantees.handler.finish-reply-lost';
    const store = new FinishBlipStore();
    t = await createSequenceTestApp(channel, { sequence: { store } });
    store.afterWrite = true;
    store.failNextFinishes = 1;
    await publishAll(t.transport, channel, makeFragments('lost-ok', bytes(3_000, 8), 1_000));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(
      await metricValue(t.metrics.registry, 'nest_sequence_sequences_completed_total', { channel }),
    ).toBe(1);
  });

  it('dead-letters a failure whose marker went in although its reply was lost', async () => {
    const channel = 'guarantees.handler.fail-reply-lost';
    const store = new FinishBlipStore();
    t = await createSequenceTestApp(channel, {
      handler: { handlerRetry: { attempts: 1, baseDelayMs: 1 } },
      sequence: { store },
    });
    t.handler.failNext = 10;
    store.afterWrite = true;
    store.failNextFinishes = 1;
    await publishAll(t.transport, channel, makeFragments('lost-fail', bytes(3_000, 7), 1_000));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(deadLetters(t.transport, channel).map(deathReasonOf)).toEqual([
      expect.stringMatching(/^handler-failed: /),
    ]);
  });

  it('records the failure once the store answers, without running the retries again', async () => {
    const channel = 'guarantees.handler.fail-blip';
    const store = new FinishBlipStore();
    t = await createSequenceTestApp(channel, {
      handler: { handlerRetry: { attempts: 2, baseDelayMs: 1 } },
      sequence: { store },
    });
    t.handler.failNext = 10;
    store.failNextFinishes = 1;
    await publishAll(t.transport, channel, makeFragments('fail-blip', bytes(3_000, 92), 1_000));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(2);
    expect(deadLetters(t.transport, channel).map(deathReasonOf)).toEqual([
      expect.stringMatching(/^handler-failed: /),
    ]);
  });
});
