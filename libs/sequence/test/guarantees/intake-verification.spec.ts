import {
  MemorySequenceStore,
  SequenceIntegrityError,
  type ReassembledPayload,
} from 'nest-sequence';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  makeFragments,
  publishAll,
  shuffled,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { InstrumentedStore } from './instrumented.sequence-store';

/**
 * Guarantees row "reassembled SHA-256 mismatch", and how it is checked: a sequence whose
 * fragments one instance stored in order was hashed as it arrived, so it is not read back just
 * to be verified; the handler's stream is then checked as it flows. Any other sequence is read
 * back and verified before the handler.
 */
describe('guarantees: verifying a sequence at intake', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('reads a sequence stored in order once: for the handler, not for verification', async () => {
    const channel = 'guarantees.intake.in-order';
    const store = new InstrumentedStore(new MemorySequenceStore());
    t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    const payload = bytes(10_000, 61);

    await publishAll(t.transport, channel, makeFragments('in-order', payload, 1_000));
    await t.transport.whenIdle();

    expect(store.reads).toBe(1);
    expect(t.handler.of('in-order')).toHaveLength(1);
    expect(t.handler.of('in-order')[0].bytes.equals(payload)).toBe(true);
  });

  it('reads a sequence that arrived out of order twice: verified before the handler, then for it', async () => {
    const channel = 'guarantees.intake.shuffled';
    const store = new InstrumentedStore(new MemorySequenceStore());
    t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    const payload = bytes(10_000, 62);

    await publishAll(t.transport, channel, shuffled(makeFragments('shuffled', payload, 1_000), 3));
    await t.transport.whenIdle();

    expect(store.reads).toBe(2);
    expect(t.handler.of('shuffled')[0].bytes.equals(payload)).toBe(true);
  });

  it('reads a sequence stored in order twice when its store does not say the completing fragment was stored (a custom store)', async () => {
    const channel = 'guarantees.intake.unsaid';
    const inner = new MemorySequenceStore();
    const accept = inner.accept.bind(inner);
    // A store written before `stored` was part of the port: its `complete` leaves it out.
    inner.accept = async (fragment, context) => {
      const result = await accept(fragment, context);
      if (result.status !== 'complete') return result;
      const { status, opened, sequence } = result;
      return { status, opened, sequence };
    };
    const store = new InstrumentedStore(inner);
    t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    const payload = bytes(10_000, 66);

    await publishAll(t.transport, channel, makeFragments('unsaid', payload, 1_000));
    await t.transport.whenIdle();

    expect(store.reads).toBe(2);
    expect(t.handler.of('unsaid')).toHaveLength(1);
    expect(t.handler.of('unsaid')[0].bytes.equals(payload)).toBe(true);
  });

  it('reads a sequence with a duplicated fragment twice, and delivers it once', async () => {
    const channel = 'guarantees.intake.duplicate';
    const store = new InstrumentedStore(new MemorySequenceStore());
    t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    const payload = bytes(5_000, 63);
    const fragments = makeFragments('duplicated', payload, 1_000);

    await publishAll(t.transport, channel, [
      ...fragments.slice(0, 3),
      fragments[1],
      ...fragments.slice(3),
    ]);
    await t.transport.whenIdle();

    expect(store.reads).toBe(2);
    expect(t.handler.calls).toBe(1);
    expect(t.handler.of('duplicated')[0].bytes.equals(payload)).toBe(true);
  });

  it('does not call the handler when the bytes stored in order do not match x-sequence-sha256', async () => {
    const channel = 'guarantees.intake.forged';
    const store = new InstrumentedStore(new MemorySequenceStore());
    t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    const fragments = makeFragments('forged-in-order', bytes(3_000, 64), 1_000);
    const last = fragments[2];
    fragments[2] = {
      ...last,
      headers: { ...last.headers, 'x-sequence-sha256': 'ab'.repeat(32) },
    };

    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(/^integrity-mismatch: sequence forged-in-order/);
  });

  /**
   * Sends a 4,000-byte sequence `id` in order to `guarantees.intake.<id>`, through a memory store
   * that gives back the first read altered, to a handler that reads it with `read`: the app, and
   * the error the handler's stream failed with, if any.
   */
  async function readBackCorrupted(
    id: string,
    read: (delivered: ReassembledPayload) => Promise<unknown>,
  ): Promise<{ app: SequenceTestApp; streamError: unknown }> {
    const channel = `guarantees.intake.${id}`;
    const store = new InstrumentedStore(new MemorySequenceStore());
    const app = await createSequenceTestApp(channel, {
      handlerRetry: { attempts: 3, baseDelayMs: 1 },
      sequence: { store },
    });
    t = app;
    store.corruptNextReads = 1;
    let streamError: unknown;
    app.handler.onCall = async (delivered) => {
      await read(delivered).catch((error: unknown) => {
        streamError = error;
        throw error;
      });
    };
    await publishAll(app.transport, channel, makeFragments(id, bytes(4_000, 65), 1_000));
    await app.transport.whenIdle();
    return { app, streamError };
  }

  it('fails the handler stream at its end, without retrying the handler, and dead-letters the sequence when the store gives back other bytes than it took', async () => {
    const channel = 'guarantees.intake.corrupt-store';
    const { app, streamError } = await readBackCorrupted('corrupt-store', (delivered) =>
      delivered.toBuffer(),
    );

    expect(streamError).toBeInstanceOf(SequenceIntegrityError);
    expect(app.handler.calls).toBe(1);
    expect(app.handler.deliveries).toHaveLength(0);
    const dead = deadLetters(app.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence corrupt-store: .*read back from the memory store/,
    );
  });

  it('fails the handler stream before its last declared byte when the store gives back other bytes: a reader that stops there is not acked', async () => {
    const channel = 'guarantees.intake.corrupt-store-exact';
    const { app, streamError } = await readBackCorrupted(
      'corrupt-store-exact',
      async (delivered) => {
        // Stops at the declared size, as a reader that knows it does: it never asks for the end.
        let read = 0;
        for await (const chunk of delivered.stream()) {
          read += (chunk as Buffer).length;
          if (read >= delivered.bytes) break;
        }
      },
    );

    expect(streamError).toBeInstanceOf(SequenceIntegrityError);
    expect(app.handler.deliveries).toHaveLength(0);
    const dead = deadLetters(app.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(/^integrity-mismatch: sequence corrupt-store-exact/);
  });
});
