import { randomBytes } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { partitionIndex } from '../../src/core/partition';
import { BrokerHeldReassembler } from '../../src/sequence/broker-held/broker-held.reassembler';
import { SpoolFile } from '../../src/sequence/broker-held/spool';
import { handOver } from '../../src/kernel/handler-call';
import { FRAGMENT_PARKING, type FragmentParking } from '../../src/kernel/pattern-contracts';
import { CLAIM_CHECK_HEADER } from '../../src/core/headers';
import {
  FilesystemPayloadStore,
  InMemoryTransport,
  MemorySequenceStore,
  type ExpiredSequence,
  type SequenceStore,
  type Subscription,
} from 'nest-sequence';
import { buildFragmentHeaders, parseFragmentHeaders } from 'nest-sequence/wire';
import { crc32 } from '../../src/core/checksum';
import { recordEvents } from '../events/event-recorder';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  firstFragment,
  makeFragments,
  makeStreamingFragments,
  publishHeld,
  shuffled,
  type SequenceTestApp,
  type TestFragment,
} from '../support/sequence-test-app';

const PARTITIONS = 4;

/** Messages of every partition of `channel`, as `count` gives them for one partition queue. */
function acrossPartitions(channel: string, count: (queue: string) => number): number {
  let total = 0;
  for (let index = 0; index < PARTITIONS; index++) total += count(`${channel}.partition.${index}`);
  return total;
}

function unsettledIn(transport: InMemoryTransport, channel: string): number {
  return acrossPartitions(channel, (queue) => transport.unsettled(queue));
}

async function spoolFiles(dir: string): Promise<string[]> {
  const files: string[] = [];
  for (const entry of await readdir(dir).catch(() => [] as string[])) {
    files.push(...(await readdir(join(dir, entry)).catch(() => [] as string[])));
  }
  return files;
}

/** Makes each spool file's removal take 50 ms longer, as on a slow disk. */
function slowSpoolRemoval(): void {
  const remove = SpoolFile.prototype.remove;
  jest.spyOn(SpoolFile.prototype, 'remove').mockImplementation(async function (this: SpoolFile) {
    await sleep(50);
    return remove.call(this);
  });
}

async function openInStore(store: SequenceStore): Promise<number> {
  return (await store.stats(Date.now())).openSequences;
}

/** Every byte in the spool files under `dir`. */
async function spooledBytes(dir: string): Promise<Buffer> {
  const contents: Buffer[] = [];
  for (const entry of await readdir(dir).catch(() => [] as string[])) {
    for (const file of await readdir(join(dir, entry)).catch(() => [] as string[])) {
      contents.push(await readFile(join(dir, entry, file)).catch(() => Buffer.alloc(0)));
    }
  }
  return Buffer.concat(contents);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The fragment a claim-checked body's ticket is issued for: the one its headers name. */
function fragmentOf(headers: TestFragment['headers']): { sequenceId: string; position: number } {
  const { sequenceId, position } = parseFragmentHeaders(headers);
  return { sequenceId, position };
}

/** `fragment` as a claim-checking producer sends it: its body parked, its ticket in its place. */
async function ticketed(
  parking: FragmentParking,
  channel: string,
  { body, headers }: TestFragment,
): Promise<TestFragment> {
  const parked = await parking.park(body, channel, fragmentOf(headers));
  await parking.settle(parked, true);
  return { body: parked.ticketBody, headers: { ...headers, [CLAIM_CHECK_HEADER]: 1 } };
}

/** A memory store whose `finish` and `accept` can be slowed, counting accepts per sequence. */
class SlowStore extends MemorySequenceStore {
  finishDelayMs = 0;
  acceptDelayMs = 0;
  statusDelayMs = 0;
  finishing = 0;
  /** How many `completed` markers to fail (the store unreachable as each is written). */
  failCompleted = 0;
  readonly accepts = new Map<string, number>();

  override async finish(...args: Parameters<MemorySequenceStore['finish']>): Promise<boolean> {
    this.finishing++;
    if (this.finishDelayMs) await sleep(this.finishDelayMs);
    if (args[1] === 'completed' && this.failCompleted > 0) {
      this.failCompleted--;
      throw new Error('store unreachable');
    }
    return super.finish(...args);
  }

  override async status(
    ...args: Parameters<MemorySequenceStore['status']>
  ): ReturnType<MemorySequenceStore['status']> {
    if (this.statusDelayMs) await sleep(this.statusDelayMs);
    return super.status(...args);
  }

  override async accept(
    ...args: Parameters<MemorySequenceStore['accept']>
  ): ReturnType<MemorySequenceStore['accept']> {
    const id = args[0].sequenceId;
    this.accepts.set(id, (this.accepts.get(id) ?? 0) + 1);
    if (this.acceptDelayMs) await sleep(this.acceptDelayMs);
    return super.accept(...args);
  }
}

/**
 * Broker-held reassembly (`buffer: 'broker'`) on the embedded transport: the guarantees table's
 * rows hold with fragments kept unsettled in the broker and bodies in the spool.
 */
describe('guarantees: broker-held reassembly', () => {
  let t: SequenceTestApp | undefined;
  let spoolDir: string;

  async function app(
    channel: string,
    sequence: Record<string, unknown> = {},
    handler: Record<string, unknown> = {},
  ): Promise<SequenceTestApp> {
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    t = await createSequenceTestApp(channel, {
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir: spoolDir }, ...sequence },
      handler,
    });
    return t;
  }

  /** One partition with a window of 4, and the sequences its `onExpired` is told of. */
  async function oneNarrowPartition(
    channel: string,
    timeoutMs: number,
  ): Promise<{ app: SequenceTestApp; expired: ExpiredSequence[] }> {
    const expired: ExpiredSequence[] = [];
    const onExpired = (sequence: ExpiredSequence) => void expired.push(sequence);
    return { app: await app(channel, { window: 4, partitions: 1, timeoutMs, onExpired }), expired };
  }

  afterEach(async () => {
    jest.restoreAllMocks();
    await t?.close();
    t = undefined;
  });

  it('delivers shuffled, duplicated fragments once, byte-exact, then acks every one', async () => {
    const channel = 'held.shuffled';
    const { transport, handler, store } = await app(channel);
    const payload = bytes(20_000, 1);
    const fragments = makeFragments('held-1', payload, 1_000);
    await publishHeld(
      transport,
      channel,
      shuffled([...fragments, ...fragments.slice(3, 9)], 7),
      PARTITIONS,
    );
    await eventually(() => handler.deliveries.length === 1, 'the handler ran');
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');

    expect(handler.of('held-1')[0].bytes.equals(payload)).toBe(true);
    expect(handler.of('held-1')[0].payload.fragments).toBe(20);
    expect(deadLetters(transport, channel)).toHaveLength(0);
    // Nothing but the marker went to the store, and the spool is empty again.
    expect(await openInStore(store)).toBe(0);
    expect(await store.status!({ scope: channel, sequenceId: 'held-1' }, Date.now())).toEqual({
      state: 'finished',
      outcome: 'completed',
    });
    expect(await spoolFiles(spoolDir)).toEqual([]);
  });

  it('spools no body in clear when the store encrypts, and delivers it byte-exact', async () => {
    const channel = 'held.encrypted';
    const store = new MemorySequenceStore({
      encryption: { keys: [{ id: 'k1', key: randomBytes(32) }] },
    });
    const { transport, handler } = await app(channel, { store });
    const secret = Buffer.from('PATIENT=DOE^JOHN;MRN=123-45-6789;'.repeat(100));
    const fragments = makeFragments('phi-1', secret, 1_000);
    // All but the last: the sequence stays open, its bodies in the spool.
    await publishHeld(transport, channel, fragments.slice(0, -1), PARTITIONS);
    await eventually(async () => (await spooledBytes(spoolDir)).length > 0, 'bodies spooled');
    await eventually(
      async () => (await spooledBytes(spoolDir)).length === 3_000, // 3 of 1,000 bytes
      'every held body spooled',
    );
    expect((await spooledBytes(spoolDir)).includes('MRN=123-45-6789')).toBe(false);

    await publishHeld(transport, channel, fragments.slice(-1), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'the handler ran');
    expect(handler.of('phi-1')[0].bytes.equals(secret)).toBe(true);
  });

  it('hands a sequence back at shutdown when its handler waits to retry, calling it no more', async () => {
    const channel = 'held.retry-at-shutdown';
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    t = await createSequenceTestApp(channel, {
      shutdownTimeoutMs: 100,
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir: spoolDir } },
      handler: { handlerRetry: { attempts: 3, baseDelayMs: 1_000, maxDelayMs: 1_000 } },
    });
    const { transport, handler } = t;
    handler.failNext = 10;
    await publishHeld(
      transport,
      channel,
      makeFragments('retrying', bytes(3_000, 4), 1_000),
      PARTITIONS,
    );
    await eventually(() => handler.calls === 1, 'the first attempt failed');

    await t.close(); // the retry waits 500-1,000 ms; the drain gives up after 100
    t = undefined;
    await sleep(1_200);

    expect(handler.calls).toBe(1);
    expect(deadLetters(transport, channel)).toHaveLength(0);
    // Every fragment, back in its partition for the next instance.
    expect(acrossPartitions(channel, (queue) => transport.depth(queue))).toBe(3);
  });

  it('holds every fragment unsettled until the sequence is complete', async () => {
    const channel = 'held.unsettled';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('held-2', bytes(5_000, 2), 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 4), PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 4, 'four fragments held');
    await eventually(async () => (await spoolFiles(spoolDir)).length === 1, 'one spool file');
    expect(handler.calls).toBe(0);

    await publishHeld(transport, channel, fragments.slice(4), PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 0, 'all settled');
    expect(handler.calls).toBe(1);
  });

  it('hands held fragments back to their partition at shutdown and removes its spool', async () => {
    const channel = 'held.shutdown';
    const { transport } = await app(channel, {}, {});
    const fragments = makeFragments('held-stop', bytes(3_000, 15), 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
    await eventually(async () => (await spoolFiles(spoolDir)).length === 1, 'spooled');
    await t!.close();
    t = undefined;

    const partition = partitionIndex('held-stop', PARTITIONS);
    expect(transport.depth(`${channel}.partition.${partition}`)).toBe(2);
    expect(await readdir(spoolDir)).toEqual([]);
  });

  it('delivers 20 interleaved sequences each once', async () => {
    const channel = 'held.interleaved';
    const { transport, handler } = await app(channel);
    const sequences = Array.from({ length: 20 }, (_, index) => ({
      id: `inter-${index}`,
      payload: bytes(1_000 + index * 977, index + 3),
    }));
    const all = shuffled(
      sequences.flatMap(({ id, payload }) => makeFragments(id, payload, 700)),
      3,
    );
    await publishHeld(transport, channel, all, PARTITIONS);
    await eventually(() => handler.deliveries.length === 20, 'all twenty handled');
    for (const { id, payload } of sequences) {
      expect(handler.of(id)).toHaveLength(1);
      expect(handler.of(id)[0].bytes.equals(payload)).toBe(true);
    }
  });

  it('acks a late duplicate after completion without calling the handler again', async () => {
    const channel = 'held.late';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('held-late', bytes(3_000, 4), 1_000);
    await publishHeld(transport, channel, fragments, PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    await publishHeld(transport, channel, [fragments[1]], PARTITIONS);
    await eventually(
      () => unsettledIn(transport, channel) === 0 && transport.depth(channel) === 0,
      'the duplicate settled',
    );
    await transport.whenIdle();
    expect(handler.calls).toBe(1);
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it('runs no handler for a sequence another instance completed while this one held it', async () => {
    const channel = 'held.completed-elsewhere';
    const store = new MemorySequenceStore();
    const { transport, handler } = await app(channel, { store });
    const fragments = makeFragments('held-elsewhere', bytes(3_000, 42), 1_000);
    // A slow disk: its spool file is gone before the broker sees the last fragment settled.
    slowSpoolRemoval();
    await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 2, 'two held');
    // As an instance the partition had moved to does once it has handled the sequence.
    await store.finish({ scope: channel, sequenceId: 'held-elsewhere' }, 'completed', {
      now: Date.now(),
      retentionMs: 60_000,
      consumerId: 'another-instance',
    });

    await publishHeld(transport, channel, fragments.slice(2), PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');
    await transport.whenIdle();

    expect(handler.calls).toBe(0);
    expect(deadLetters(transport, channel)).toHaveLength(0);
    expect(await spoolFiles(spoolDir)).toEqual([]);
  });

  it('closes the streams a handler left unread once it returns, without an uncaught error', async () => {
    const channel = 'held.left-streams';
    const { transport, handler } = await app(channel);
    const left: Readable[] = [];
    // Handed on to be read later, with nobody listening for its errors: read after the spool
    // file is gone, it would fail with an uncaught 'error'.
    handler.onCall = async (payload) => {
      const stream = payload.stream();
      left.push(stream);
      stream.pause();
      setTimeout(() => stream.resume(), 50);
    };
    const fragments = makeFragments('held-left', bytes(3_000, 43), 1_000);
    await publishHeld(transport, channel, fragments, PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    await transport.whenIdle();
    await sleep(150);

    expect(left).toHaveLength(1);
    expect(left[0].destroyed).toBe(true);
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it('acks a late duplicate after completion whose marker the store failed to write', async () => {
    const channel = 'held.late-unrecorded';
    const store = new SlowStore();
    store.failCompleted = 1;
    const expired: string[] = [];
    const onExpired = (sequence: ExpiredSequence) => void expired.push(sequence.sequenceId);
    const { transport, handler } = await app(channel, { store, timeoutMs: 200, onExpired });
    const fragments = makeFragments('held-late-unrecorded', bytes(3_000, 41), 1_000);
    await publishHeld(transport, channel, fragments, PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    // Past the marker's failed write: the duplicate must not open the sequence afresh.
    await publishHeld(transport, channel, [fragments[1]], PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 0, 'the duplicate settled');
    await sleep(400); // beyond timeoutMs: a sequence opened again would have expired by now
    expect(deadLetters(transport, channel)).toHaveLength(0);
    expect(expired).toEqual([]);
    expect(handler.calls).toBe(1);
    // The marker, written again as the duplicate came, answers for the sequence from now on.
    expect(
      (await store.status({ scope: channel, sequenceId: 'held-late-unrecorded' }, Date.now()))
        .state,
    ).toBe('finished');
  });

  it('never delivers a payload whose SHA-256 does not match: every fragment is dead-lettered', async () => {
    const channel = 'held.sha';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('held-sha', bytes(4_000, 5), 1_000);
    const last = fragments[3];
    fragments[3] = {
      body: last.body,
      headers: { ...last.headers, 'x-sequence-sha256': 'ab'.repeat(32) },
    };
    await publishHeld(transport, channel, fragments, PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 4, 'four dead letters');

    expect(handler.calls).toBe(0);
    for (const letter of deadLetters(transport, channel)) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/^integrity-mismatch: /);
    }
  });

  it('dead-letters every fragment with the reason once the handler failed its retries', async () => {
    const channel = 'held.failing';
    const { transport, handler } = await app(
      channel,
      {},
      { handlerRetry: { attempts: 2, baseDelayMs: 1 } },
    );
    handler.failNext = 2;
    await publishHeld(
      transport,
      channel,
      makeFragments('held-fail', bytes(3_000, 6), 1_000),
      PARTITIONS,
    );
    await eventually(() => deadLetters(transport, channel).length === 3, 'three dead letters');

    expect(handler.calls).toBe(2);
    const reasons = deadLetters(transport, channel).map((m) => String(m.headers['x-death-reason']));
    expect(new Set(reasons).size).toBe(1);
    expect(reasons[0]).toMatch(/^handler-failed: .*handler failure #2/);
    expect(await spoolFiles(spoolDir)).toEqual([]);
  });

  it('names the sequence once in the reason of a failed handler or a SHA-256 mismatch, as the store path does', async () => {
    const channel = 'held.reasons';
    const { transport, handler } = await app(channel, {}, { handlerRetry: { attempts: 1 } });
    handler.failNext = 1;
    await publishHeld(
      transport,
      channel,
      makeFragments('held-reason-a', bytes(2_000, 42), 1_000),
      PARTITIONS,
    );
    const mismatched = makeFragments('held-reason-b', bytes(2_000, 43), 1_000);
    mismatched[1] = {
      body: mismatched[1].body,
      headers: { ...mismatched[1].headers, 'x-sequence-sha256': 'cd'.repeat(32) },
    };
    await publishHeld(transport, channel, mismatched, PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 4, 'four dead letters');

    const reasons = deadLetters(transport, channel).map((m) => String(m.headers['x-death-reason']));
    const failed = reasons.filter((reason) => reason.startsWith('handler-failed: '));
    const mismatch = reasons.filter((reason) => reason.startsWith('integrity-mismatch: '));
    expect(failed).toHaveLength(2);
    expect(mismatch).toHaveLength(2);
    for (const reason of failed) {
      expect(reason).toMatch(
        /^handler-failed: sequence held-reason-a: handler failed 1 time\(s\); last error: handler failure #1$/,
      );
    }
    for (const reason of mismatch) {
      expect(reason).toMatch(/^integrity-mismatch: sequence held-reason-b: reassembled 2000 bytes/);
    }
  });

  it('expires an incomplete sequence: its fragments are dead-lettered, its spool deleted, late ones refused', async () => {
    const channel = 'held.expiry';
    const expired: string[] = [];
    const { transport, handler } = await app(channel, {
      timeoutMs: 200,
      onExpired: (sequence: { sequenceId: string }) => void expired.push(sequence.sequenceId),
    });
    const fragments = makeFragments('held-exp', bytes(4_000, 7), 1_000);
    await publishHeld(transport, channel, [fragments[0], fragments[2]], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 2, 'two dead letters');

    expect(handler.calls).toBe(0);
    expect(expired).toEqual(['held-exp']);
    for (const letter of deadLetters(transport, channel)) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/^sequence-expired: /);
    }
    expect(await spoolFiles(spoolDir)).toEqual([]);

    await publishHeld(transport, channel, [fragments[1]], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 3, 'the late one refused');
    expect(String(deadLetters(transport, channel)[2].headers['x-death-reason'])).toMatch(
      /^sequence-expired: /,
    );
  });

  it('waits out a timeoutMs longer than a timer can wait before expiring a sequence', async () => {
    const channel = 'held.expiry-long';
    // 30 days: past the 2^31 - 1 ms (24.8 days) a Node timer waits; a longer one fires at 1 ms.
    const timeoutMs = 30 * 24 * 3_600_000;
    const { transport, handler } = await app(channel, { timeoutMs });
    const early = makeFragments('held-long', bytes(3_000, 24), 1_000);
    await publishHeld(transport, channel, early.slice(0, 2), PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 2, 'two fragments held');
    await sleep(100);
    expect(deadLetters(transport, channel)).toHaveLength(0);
    await publishHeld(transport, channel, early.slice(2), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'the sequence handled');

    // Its deadline still holds: timers faked from the first fragment of the next sequence.
    jest.useFakeTimers({
      advanceTimers: true,
      doNotFake: ['setImmediate', 'nextTick', 'queueMicrotask'],
    });
    try {
      const late = makeFragments('held-long-2', bytes(3_000, 25), 1_000);
      await publishHeld(transport, channel, late.slice(0, 2), PARTITIONS);
      await eventually(() => unsettledIn(transport, channel) === 2, 'two fragments held');
      jest.advanceTimersByTime(timeoutMs - 1_000);
      await sleep(50);
      expect(deadLetters(transport, channel)).toHaveLength(0);
      jest.advanceTimersByTime(2_000);
      await eventually(
        () => deadLetters(transport, channel).length === 2,
        'expired at its deadline',
      );
      expect(String(deadLetters(transport, channel)[0].headers['x-death-reason'])).toMatch(
        /^sequence-expired: /,
      );
    } finally {
      jest.useRealTimers();
    }
  });

  it('dead-letters an expired sequence and frees its window without waiting for onExpired', async () => {
    const channel = 'held.expiry-hook';
    const called: string[] = [];
    const { transport, handler } = await app(channel, {
      timeoutMs: 200,
      window: 4,
      partitions: 1,
      // A hook that never settles (a webhook without a timeout, say).
      onExpired: (sequence: { sequenceId: string }) => {
        called.push(sequence.sequenceId);
        return new Promise<void>(() => undefined);
      },
    });
    const partition = { partition: { index: 0, count: 1 } };
    const stuck = makeFragments('held-hook', bytes(4_000, 22), 1_000);
    for (const { body, headers } of stuck.slice(0, 3)) {
      await transport.publish(channel, body, headers, partition);
    }
    await eventually(() => deadLetters(transport, channel).length === 3, 'three dead letters');
    expect(called).toEqual(['held-hook']);
    expect(await spoolFiles(spoolDir)).toEqual([]);

    // The partition's window is free again for the next sequence.
    const next = bytes(4_000, 23);
    for (const { body, headers } of makeFragments('held-after-hook', next, 1_000)) {
      await transport.publish(channel, body, headers, partition);
    }
    await eventually(() => handler.deliveries.length === 1, 'the next sequence handled');
    expect(handler.of('held-after-hook')[0].bytes.equals(next)).toBe(true);
    await eventually(() => transport.unsettled(`${channel}.partition.0`) === 0, 'all settled');
  });

  it('moves what it holds of a streamed sequence to the store when its last fragment declares more than the window', async () => {
    const channel = 'held.late-size';
    const { app: narrow, expired } = await oneNarrowPartition(channel, 500);
    const { transport, store, sweeper } = narrow;
    // Streamed: only the last fragment tells the size (5, over the window). The third never
    // comes (dead-lettered on its way for a bad CRC, say), the fourth not yet.
    const fragments = makeStreamingFragments('held-late-size', bytes(5_000, 44), 1_000);
    const partition = { partition: { index: 0, count: 1 } };
    for (const { body, headers } of [fragments[0], fragments[1], fragments[4]]) {
      await transport.publish(channel, body, headers, partition);
    }
    // One place for the whole sequence: the store, every fragment taken there and acked.
    await sleep(150);
    expect(transport.unsettled(`${channel}.partition.0`)).toBe(0);
    expect(await openInStore(store)).toBe(1);
    expect(await spoolFiles(spoolDir)).toEqual([]);

    await sleep(500);
    await sweeper.sweep(Date.now());
    await eventually(() => expired.length === 1, 'expired once');
    expect(expired[0].receivedPositions).toEqual([1, 2, 5]);
    // The store path's expiry record, which knows the last fragment came.
    expect(deadLetters(transport, channel).map((m) => m.headers['x-death-reason'])).toEqual([
      expect.stringMatching(/with 3 fragment\(s\) received, missing 3-4$/),
    ]);
  });

  it('expires a sequence moved to the store timeoutMs after its first fragment, not after the move', async () => {
    const channel = 'held.moved-deadline';
    const { app: narrow, expired } = await oneNarrowPartition(channel, 1_000);
    const { transport, sweeper } = narrow;
    const fragments = makeStreamingFragments('held-moved', bytes(5_000, 45), 1_000);
    const partition = { partition: { index: 0, count: 1 } };
    const firstAt = Date.now();
    for (const { body, headers } of fragments.slice(0, 2)) {
      await transport.publish(channel, body, headers, partition);
    }
    // Most of its time gone, its last fragment declares more than the window: it moves.
    await sleep(700);
    await transport.publish(channel, fragments[4].body, fragments[4].headers, partition);
    await eventually(() => transport.unsettled(`${channel}.partition.0`) === 0, 'moved');

    await sleep(Math.max(0, firstAt + 1_100 - Date.now()));
    await sweeper.sweep(Date.now());
    await eventually(() => expired.length === 1, "expired at its first fragment's deadline");
    expect(expired[0].firstFragmentAt).toBeLessThan(firstAt + 100);
    expect(expired[0].ageMs).toBeGreaterThanOrEqual(1_000);
  });

  it('dead-letters a fragment that fails its CRC at once and keeps holding the rest', async () => {
    const channel = 'held.crc';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('held-crc', bytes(3_000, 8), 1_000);
    const bad = { body: Buffer.from(fragments[1].body).fill(0), headers: fragments[1].headers };
    await publishHeld(transport, channel, [fragments[0], bad, fragments[2]], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 1, 'one dead letter');
    expect(String(deadLetters(transport, channel)[0].headers['x-death-reason'])).toMatch(
      /^crc-mismatch: /,
    );
    await publishHeld(transport, channel, [fragments[1]], PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled once the good copy came');
    expect(
      handler.of('held-crc')[0].bytes.equals(Buffer.concat(fragments.map((f) => f.body))),
    ).toBe(true);
  });

  it('dead-letters alone a fragment whose size beyond the window the held fragments contradict', async () => {
    const channel = 'held.size-beyond';
    const { transport, handler, store } = await app(channel, { window: 4 });
    const fragments = makeFragments('held-size', bytes(3_000, 42), 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
    await eventually(async () => (await spoolFiles(spoolDir)).length === 1, 'held');
    const body = bytes(500, 43);
    const headers = buildFragmentHeaders({
      sequenceId: 'held-size',
      position: 1,
      size: 10, // more than the window; the held fragments say 3
      last: false,
      crc32: crc32(body),
    });
    await publishHeld(transport, channel, [{ body, headers }], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 1, 'refused');
    await publishHeld(transport, channel, fragments.slice(2), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(deadLetters(transport, channel).map((m) => String(m.headers['x-death-reason']))).toEqual(
      [expect.stringMatching(/^size-changed: sequence held-size fragment 1: /)],
    );
    expect(
      handler.of('held-size')[0].bytes.equals(Buffer.concat(fragments.map((f) => f.body))),
    ).toBe(true);
    expect(await openInStore(store)).toBe(0);
  });

  /** `fragment` carrying these content headers (`content-type`, `content-encoding`). */
  const describedAs = (fragment: TestFragment, content: Record<string, string>): TestFragment => ({
    ...fragment,
    headers: { ...fragment.headers, ...content },
  });

  it('tells the handler the content-type and content-encoding of whichever fragment carried them', async () => {
    const channel = 'held.content-later';
    const { transport, handler } = await app(channel);
    const fragments = makeFragments('held-content-later', bytes(3_000, 44), 1_000);
    await publishHeld(
      transport,
      channel,
      [
        fragments[0],
        describedAs(fragments[1], { 'content-type': 'application/json' }),
        describedAs(fragments[2], { 'content-encoding': 'gzip' }),
      ],
      PARTITIONS,
    );
    await eventually(() => handler.deliveries.length === 1, 'handled');

    expect(handler.of('held-content-later')[0].payload).toMatchObject({
      contentType: 'application/json',
      contentEncoding: 'gzip',
    });
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it.each([
    ['content-type', 'application/json', 'text/plain'],
    ['content-encoding', 'gzip', 'br'],
  ])(
    'dead-letters alone a fragment whose %s contradicts the held ones, as the store does',
    async (header, declared, other) => {
      const channel = `held.${header}-changed`;
      const { transport, handler, store } = await app(channel);
      const id = `held-${header}-changed`;
      const fragments = makeFragments(id, bytes(3_000, 45), 1_000).map((fragment) =>
        describedAs(fragment, { [header]: declared }),
      );
      await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
      await publishHeld(
        transport,
        channel,
        [describedAs(fragments[2], { [header]: other })],
        PARTITIONS,
      );
      await eventually(() => deadLetters(transport, channel).length === 1, 'refused');
      await publishHeld(transport, channel, fragments.slice(2), PARTITIONS);
      await eventually(() => handler.deliveries.length === 1, 'handled');

      expect(
        deadLetters(transport, channel).map((m) => String(m.headers['x-death-reason'])),
      ).toEqual([
        `declaration-changed: sequence ${id} fragment 3: ${header} ${other} differs from the ` +
          `declared ${declared}`,
      ]);
      expect(handler.of(id)[0].bytes.equals(Buffer.concat(fragments.map((f) => f.body)))).toBe(
        true,
      );
      expect(await openInStore(store)).toBe(0);
    },
  );

  it('takes a sequence declaring more fragments than the window through the store', async () => {
    const channel = 'held.too-many';
    const { transport, handler, store } = await app(channel, { window: 4 });
    const payload = bytes(6_000, 9);
    const fragments = makeFragments('held-big', payload, 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 5), PARTITIONS);
    await eventually(async () => (await openInStore(store)) === 1, 'stored');
    await eventually(() => unsettledIn(transport, channel) === 0, 'acked once stored');
    await publishHeld(transport, channel, fragments.slice(5), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(handler.of('held-big')[0].bytes.equals(payload)).toBe(true);
  });

  it('relieves a full window by sending the youngest sequence through the store', async () => {
    const channel = 'held.window';
    const { transport, handler, store } = await app(channel, { window: 4, partitions: 1 });
    const a = makeFragments('win-a', bytes(3_000, 10), 1_000);
    const b = makeFragments('win-b', bytes(3_000, 11), 1_000);
    const one = async (fragment: TestFragment) =>
      transport.publish(channel, fragment.body, fragment.headers, {
        partition: { index: 0, count: 1 },
      });
    for (const fragment of [a[0], b[0], a[1], b[1]]) await one(fragment);
    // The window (4) is full with neither complete: the youngest (win-b) went to the store.
    await eventually(async () => (await openInStore(store)) === 1, 'win-b stored');
    for (const fragment of [a[2], b[2]]) await one(fragment);
    await eventually(() => handler.deliveries.length === 2, 'both handled');
    expect(handler.of('win-a')).toHaveLength(1);
    expect(handler.of('win-b')).toHaveLength(1);
    expect(handler.of('win-b')[0].bytes.equals(Buffer.concat(b.map((f) => f.body)))).toBe(true);
  });

  it('moves nothing while a complete sequence of the full window is being handled', async () => {
    const channel = 'held.window-complete';
    const { transport, handler, store } = await app(channel, { window: 4, partitions: 1 });
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    handler.onCall = (payload) => (payload.sequenceId === 'done-a' ? gate : Promise.resolve());
    const one = (fragment: TestFragment) =>
      transport.publish(channel, fragment.body, fragment.headers, {
        partition: { index: 0, count: 1 },
      });
    const a = makeFragments('done-a', bytes(3_000, 71), 1_000);
    const b = makeFragments('next-b', bytes(2_000, 72), 1_000);
    for (const fragment of a) await one(fragment);
    await eventually(() => handler.calls === 1, 'done-a complete, its handler running');
    // The window (4) is full: done-a's three fragments and next-b's first.
    await one(b[0]);
    await sleep(100);
    // done-a frees the window when it settles: next-b stays held, out of the store.
    expect(await openInStore(store)).toBe(0);
    open();
    await one(b[1]);
    await eventually(() => handler.deliveries.length === 2, 'both handled');
    expect(await openInStore(store)).toBe(0);
    expect(handler.of('next-b')[0].bytes.equals(Buffer.concat(b.map((f) => f.body)))).toBe(true);
  });

  it('takes a sequence beyond the spool budget through the store', async () => {
    const channel = 'held.spool-full';
    const { transport, handler, store } = await app(channel, { spool: { maxBytes: 2_500 } });
    const payload = bytes(4_000, 12);
    const fragments = makeFragments('held-spool', payload, 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 3), PARTITIONS);
    await eventually(async () => (await openInStore(store)) === 1, 'moved to the store');
    await publishHeld(transport, channel, fragments.slice(3), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(handler.of('held-spool')[0].bytes.equals(payload)).toBe(true);
    expect(await spoolFiles(spoolDir)).toEqual([]);
  });

  it("keeps spooling after its process's spool directory was removed under it", async () => {
    const channel = 'held.spool-removed';
    const store = new SlowStore();
    const { transport, handler } = await app(channel, { store });
    const first = bytes(3_000, 24);
    await publishHeld(transport, channel, makeFragments('held-before', first, 1_000), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'the first handled');
    // A temp-directory cleaner (systemd-tmpfiles, tmpreaper) removes the idle directory.
    for (const entry of await readdir(spoolDir)) {
      rmSync(join(spoolDir, entry), { recursive: true, force: true });
    }

    const second = bytes(3_000, 25);
    await publishHeld(transport, channel, makeFragments('held-after', second, 1_000), PARTITIONS);
    await eventually(() => handler.deliveries.length === 2, 'the second handled');
    expect(handler.of('held-after')[0].bytes.equals(second)).toBe(true);
    // Spooled and held in the broker, not moved to the store.
    expect(store.accepts.get('held-after') ?? 0).toBe(0);
  });

  it('takes a sequence through the store with the bodies the spool failed to write', async () => {
    const channel = 'held.write-fails';
    const { transport, handler } = await app(channel);
    const payload = bytes(3_000, 41);
    // The disk refuses the first body (ENOSPC); the two after it are written.
    const write = SpoolFile.prototype.write;
    jest.spyOn(SpoolFile.prototype, 'write').mockImplementation(function (
      this: SpoolFile,
      body: Buffer,
      offset: number,
    ) {
      if (offset === 0) {
        return Promise.reject(
          Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' }),
        );
      }
      return write.call(this, body, offset);
    });
    await publishHeld(transport, channel, makeFragments('held-enospc', payload, 1_000), PARTITIONS);
    await eventually(
      () => handler.deliveries.length === 1 || deadLetters(transport, channel).length > 0,
      'handled or dead-lettered',
    );
    expect(deadLetters(transport, channel).map((m) => m.headers['x-death-reason'])).toEqual([]);
    expect(handler.deliveries).toHaveLength(1);
    expect(handler.of('held-enospc')[0].bytes.equals(payload)).toBe(true);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');
  });

  it('moves a sequence to the store at its first failed spool write, before it is complete', async () => {
    const channel = 'held.disk-full';
    const { transport, handler, store } = await app(channel);
    // The disk is full: every spool write fails with ENOSPC.
    jest
      .spyOn(SpoolFile.prototype, 'write')
      .mockRejectedValue(
        Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' }),
      );
    const payload = bytes(5_000, 10);
    const fragments = makeFragments('held-disk-full', payload, 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 3), PARTITIONS);
    // Not kept in memory until the sequence completes: in the store, its fragments acked.
    await eventually(async () => (await openInStore(store)) === 1, 'moved to the store');
    await eventually(() => unsettledIn(transport, channel) === 0, 'acked as stored');
    await publishHeld(transport, channel, fragments.slice(3), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(handler.of('held-disk-full')[0].bytes.equals(payload)).toBe(true);
    expect(deadLetters(transport, channel)).toEqual([]);
  });

  /**
   * Two instances of one partition on one transport and store: a, subscribed first, is its
   * active consumer; `takeFromA()` closes a's partition subscription while a runs on, as the broker
   * takes a partition away (RabbitMQ's consumer_timeout, a NATS lease that lapsed).
   */
  async function twoInstances(channel: string, store: MemorySequenceStore) {
    const transport = new InMemoryTransport();
    const expired: string[] = [];
    const spools = [0, 1].map(() => mkdtempSync(join(tmpdir(), 'nseq-spool-test-')));
    const options = (dir: string) => ({
      transport,
      sequence: {
        store,
        buffer: 'broker' as const,
        partitions: 1,
        timeoutMs: 400,
        spool: { dir },
        onExpired: (sequence: ExpiredSequence) => void expired.push(sequence.sequenceId),
      },
    });
    const partitioned: Subscription[] = [];
    const subscribe = transport.subscribe.bind(transport);
    const spy = jest
      .spyOn(transport, 'subscribe')
      .mockImplementation(async (name, handler, opts) => {
        const subscription = await subscribe(name, handler, opts);
        if (opts?.partitions !== undefined) partitioned.push(subscription);
        return subscription;
      });
    const a = await createSequenceTestApp(channel, options(spools[0]));
    spy.mockRestore();
    const b = await createSequenceTestApp(channel, options(spools[1]));
    const takeFromA = () => partitioned[0].close();
    const close = async () => {
      await a.close();
      await b.close();
    };
    return { transport, a, b, expired, spoolOfA: spools[0], takeFromA, close };
  }

  it('drops a sequence whose partition the broker moved to another instance: no expiry, no marker', async () => {
    const channel = 'held.taken-over';
    const store = new MemorySequenceStore();
    const { transport, a, b, expired, takeFromA, close } = await twoInstances(channel, store);
    try {
      const payload = bytes(4_000, 61);
      const fragments = makeFragments('moved', payload, 1_000);
      await publishHeld(transport, channel, fragments.slice(0, 2), 1);
      await eventually(() => transport.unsettled(`${channel}.partition.0`) === 2, 'a holds two');
      await sleep(250);
      await takeFromA();
      await eventually(() => transport.unsettled(`${channel}.partition.0`) === 2, 'b holds two');
      // The rest comes within b's timeout, after a's would have fired.
      await sleep(250);
      await publishHeld(transport, channel, fragments.slice(2), 1);
      await eventually(() => b.handler.deliveries.length === 1, 'b handled it');
      expect(b.handler.of('moved')[0].bytes.equals(payload)).toBe(true);
      await sleep(100);

      expect(a.handler.calls).toBe(0);
      expect(expired).toEqual([]);
      expect(await store.status({ scope: channel, sequenceId: 'moved' }, Date.now())).toEqual({
        state: 'finished',
        outcome: 'completed',
      });
      // A late duplicate is acked as one of a completed sequence.
      await publishHeld(transport, channel, [fragments[0]], 1);
      await eventually(() => transport.unsettled(`${channel}.partition.0`) === 0, 'settled');
      await transport.whenIdle();
      expect(deadLetters(transport, channel)).toEqual([]);
    } finally {
      await close();
    }
  });

  it('keeps nothing open for a sequence whose first fragment was taken back while it was opened', async () => {
    const channel = 'held.taken-while-opening';
    const store = new SlowStore();
    store.statusDelayMs = 150;
    const { transport, a, b, spoolOfA, takeFromA, close } = await twoInstances(channel, store);
    try {
      const payload = bytes(3_000, 5);
      const fragments = makeFragments('opening', payload, 1_000);
      await publishHeld(transport, channel, fragments.slice(0, 1), 1);
      await eventually(() => transport.unsettled(`${channel}.partition.0`) === 1, 'a has it');
      // a is asking the store about the sequence when the broker takes its delivery back.
      await sleep(30);
      await takeFromA();
      await sleep(300);
      store.statusDelayMs = 0;
      await publishHeld(transport, channel, fragments.slice(1), 1);
      await eventually(() => b.handler.deliveries.length === 1, 'b handled it');
      await sleep(100);

      // Else a stale open sequence on a would take the late duplicates of a completed sequence.
      const reassembler: unknown = a.app.get(BrokerHeldReassembler);
      const { held } = reassembler as { held: Map<string, unknown> };
      expect({ held: held.size, spool: await spoolFiles(spoolOfA) }).toEqual({
        held: 0,
        spool: [],
      });
    } finally {
      await close();
    }
  });

  it('keeps nothing open for a first fragment refused as a contradiction', async () => {
    const channel = 'held.first-refused';
    const { transport } = await app(channel);
    // On a slow disk too, the spool file is gone before the fragment is dead-lettered.
    slowSpoolRemoval();
    // Its body alone passes the bytes it declares for the whole sequence.
    await publishHeld(transport, channel, [firstFragment('held-refused', 2, 10)], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 1, 'dead-lettered');
    expect(await spoolFiles(spoolDir)).toEqual([]);
    expect(String(deadLetters(transport, channel)[0].headers['x-death-reason'])).toMatch(
      /^declaration-changed: /,
    );
  });

  it('refuses alone a first fragment over the limits, as the store does: no verdict kept, no start reported', async () => {
    const channel = 'held.first-over-limit';
    const { app: nest, transport, store } = await app(channel, { maxSequenceBytes: 1_000 });
    const events = recordEvents(nest);
    await publishHeld(transport, channel, [firstFragment('held-too-big', 3, 5_000)], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 1, 'dead-lettered');
    await eventually(async () => (await spoolFiles(spoolDir)).length === 0, 'no spool file left');

    expect(String(deadLetters(transport, channel)[0].headers['x-death-reason'])).toMatch(
      /^sequence-too-large: /,
    );
    expect(await store.status!({ scope: channel, sequenceId: 'held-too-big' }, Date.now())).toEqual(
      { state: 'unknown' },
    );
    expect(events.only('sequence.started', 'sequence.rejected')).toEqual([]);
    expect(events.only('fragment.rejected')).toHaveLength(1);
    // A corrected resend under the same id is taken.
    const payload = bytes(900, 3);
    await publishHeld(transport, channel, makeFragments('held-too-big', payload, 300), PARTITIONS);
    await eventually(() => t!.handler.deliveries.length === 1, 'the resend delivered');
    expect(t!.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it("carries on, the file left, when a refused first fragment's spool file cannot be removed", async () => {
    const channel = 'held.unremovable-spool';
    const { transport } = await app(channel);
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      jest.spyOn(SpoolFile.prototype, 'remove').mockRejectedValue(
        Object.assign(new Error('EROFS: read-only file system, unlink (expected by the test)'), {
          code: 'EROFS',
        }),
      );
      const refused = firstFragment('held-refused-erofs', 2, 10);
      await publishHeld(transport, channel, [refused], PARTITIONS);
      await eventually(() => deadLetters(transport, channel).length === 1, 'dead-lettered');
      await sleep(20);
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
    }
  });

  it('never both handles and expires a sequence whose last fragment comes as it expires', async () => {
    const channel = 'held.expiry-race';
    const store = new SlowStore();
    store.finishDelayMs = 300;
    const { transport, handler } = await app(channel, { timeoutMs: 200, store });
    const fragments = makeFragments('held-race', bytes(3_000, 17), 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
    await eventually(() => store.finishing > 0, 'expiry began');
    await publishHeld(transport, channel, fragments.slice(2), PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 3, 'all three dead-lettered');
    expect(handler.calls).toBe(0);
    for (const letter of deadLetters(transport, channel)) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/^sequence-expired: /);
    }
  });

  it('spills only the youngest sequence of a full window while the store takes it slowly', async () => {
    const channel = 'held.no-cascade';
    const store = new SlowStore();
    store.acceptDelayMs = 60;
    const { transport, handler } = await app(channel, { window: 4, partitions: 1, store });
    const x = makeFragments('x', bytes(3_000, 18), 1_000);
    const y = makeFragments('y', bytes(4_000, 19), 1_000);
    const one = (fragment: TestFragment) =>
      transport.publish(channel, fragment.body, fragment.headers, {
        partition: { index: 0, count: 1 },
      });
    await one(x[0]);
    await eventually(async () => (await spoolFiles(spoolDir)).length === 1, 'x held');
    for (const fragment of y.slice(0, 3)) await one(fragment);
    for (const fragment of [x[1], x[2], y[3]]) await one(fragment);
    await eventually(() => handler.deliveries.length === 2, 'both handled');
    expect(store.accepts.get('x') ?? 0).toBe(0);
    expect(store.accepts.get('y')).toBeGreaterThanOrEqual(4);
  });

  it('relieves a full window once a sequence refused at its first fragment has settled', async () => {
    const channel = 'held.refused-in-full';
    const store = new SlowStore();
    store.finishDelayMs = 300; // the refused sequence is settling while the window fills
    const { transport, handler } = await app(channel, {
      window: 4,
      partitions: 1,
      store,
      timeoutMs: 2_000,
      maxSequenceBytes: 10_000,
    });
    const one = (fragment: TestFragment) =>
      transport.publish(channel, fragment.body, fragment.headers, {
        partition: { index: 0, count: 1 },
      });
    const a = makeFragments('full-a', bytes(4_000, 44), 1_000);
    const b = makeFragments('full-b', bytes(20_000, 45), 10_000); // over maxSequenceBytes
    const c = makeFragments('full-c', bytes(2_000, 46), 1_000);
    for (const fragment of [...a.slice(0, 3), b[0], c[0], a[3], c[1]]) await one(fragment);
    await eventually(() => handler.deliveries.length === 2, 'both handled before they expire');
    expect(handler.of('full-a')).toHaveLength(1);
    expect(handler.of('full-c')).toHaveLength(1);
    expect(deadLetters(transport, channel).map((m) => String(m.headers['x-death-reason']))).toEqual(
      [expect.stringMatching(/^sequence-too-large: /)],
    );
  });

  it('spools again, rather than fails, a shuffled sequence whose spooled bytes changed on disk', async () => {
    const channel = 'held.bitrot-shuffled';
    const { transport, handler } = await app(channel);
    // Once, before the spool is read back (for its SHA-256: the fragments came out of order), the
    // disk changes the first byte of the body at position 2.
    let damaged = 0;
    const read = SpoolFile.prototype.read;
    jest.spyOn(SpoolFile.prototype, 'read').mockImplementation(function (
      this: SpoolFile,
      ...args: Parameters<SpoolFile['read']>
    ) {
      const second = args[0].find((range) => range.position === 2);
      if (damaged === 0 && second) {
        damaged++;
        const fd = openSync(this.path, 'r+');
        writeSync(fd, Buffer.from([0x5a ^ 0xff]), 0, 1, second.offset);
        closeSync(fd);
      }
      return read.apply(this, args);
    });
    const payload = bytes(8_000, 26);
    payload[1_000] = 0x5a; // the first byte of position 2
    await publishHeld(
      transport,
      channel,
      shuffled(makeFragments('held-bitrot', payload, 1_000), 3),
      PARTITIONS,
    );
    await eventually(() => handler.deliveries.length === 1, 'handled', 10_000);
    expect(handler.of('held-bitrot')[0].bytes.equals(payload)).toBe(true);
    expect(damaged).toBe(1);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');
    expect(deadLetters(transport, channel)).toEqual([]);
  });

  it('runs no reply of a call whose spooled bytes failed, until the delivery that settles it', async () => {
    const channel = 'held.bitrot-reply';
    const { transport, handler } = await app(channel, {}, {});
    // What a request's handler hands over (its reply): run only for the delivery that settles.
    const ran: string[] = [];
    handler.onCall = async (_payload, context) =>
      handOver(context, {
        afterCall: async () => void ran.push('afterCall'),
        onGiveUp: async () => void ran.push('onGiveUp'),
      });
    let damaged = 0;
    const read = SpoolFile.prototype.read;
    jest.spyOn(SpoolFile.prototype, 'read').mockImplementation(function (
      this: SpoolFile,
      ...args: Parameters<SpoolFile['read']>
    ) {
      const [first] = args[0];
      if (damaged === 0 && first) {
        damaged++;
        const fd = openSync(this.path, 'r+');
        writeSync(fd, Buffer.from([0x61 ^ 0xff]), 0, 1, first.offset);
        closeSync(fd);
      }
      return read.apply(this, args);
    });
    const payload = bytes(4_000, 0x61);
    payload.fill(0x61, 0, 1);
    // In order: the SHA-256 is hashed as the fragments arrive, the spool read only by the handler.
    await publishHeld(transport, channel, makeFragments('held-reply', payload, 1_000), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'handled', 10_000);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');
    expect(damaged).toBe(1);
    expect(handler.calls).toBe(2);
    expect(ran).toEqual(['afterCall']);
    expect(deadLetters(transport, channel)).toEqual([]);
  });

  it('settles a duplicate that meets its sequence as it moves to the store', async () => {
    const channel = 'held.spill-duplicate';
    const store = new SlowStore();
    store.acceptDelayMs = 100;
    const dir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    const {
      app: nest,
      transport,
      handler,
    } = await app(channel, {
      store,
      spool: { dir, maxBytes: 2_500 },
    });
    const payload = bytes(4_000, 27);
    const fragments = makeFragments('held-spill-dup', payload, 1_000);
    await publishHeld(transport, channel, fragments.slice(0, 2), PARTITIONS);
    const reassembler = nest.get(BrokerHeldReassembler);
    await eventually(() => reassembler.spooledBytes === 2_000, 'two held');
    // The broker delivers the second again (after a lost channel, say), and the event loop is
    // slow to go on with it once it found the sequence held: meanwhile the third fragment passes
    // the spool's budget and the sequence starts moving to the store.
    type Find = (...args: unknown[]) => Promise<unknown>;
    const holder = reassembler as unknown as { sequenceOf: Find };
    const find = holder.sequenceOf.bind(reassembler);
    jest.spyOn(holder, 'sequenceOf').mockImplementationOnce(async (...args: unknown[]) => {
      const found = await find(...args);
      await sleep(50);
      return found;
    });
    await publishHeld(transport, channel, [fragments[1]], PARTITIONS);
    await publishHeld(transport, channel, [fragments[2]], PARTITIONS);
    await publishHeld(transport, channel, [fragments[3]], PARTITIONS);

    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(handler.of('held-spill-dup')[0].bytes.equals(payload)).toBe(true);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every delivery settled');
    expect(deadLetters(transport, channel)).toEqual([]);
    rmSync(dir, { recursive: true, force: true });
  });

  it('completes once a held sequence whose producer claim-checked some of its fragments', async () => {
    const channel = 'held.mixed-claim-check';
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    const root = mkdtempSync(join(tmpdir(), 'nseq-parked-test-'));
    t = await createSequenceTestApp(channel, {
      claimCheck: { store: new FilesystemPayloadStore({ root }) },
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir: spoolDir } },
    });
    const { transport, handler, app: nest } = t;
    // A producer of its own, which parks some bodies and publishes their tickets instead.
    const parking = nest.get<FragmentParking>(FRAGMENT_PARKING);
    // The ticket comes once the sequence is held here, ...
    const held = bytes(3_000, 45);
    const heldFirst = makeFragments('held-mixed', held, 1_000);
    await publishHeld(transport, channel, [heldFirst[0]], PARTITIONS);
    await eventually(() => unsettledIn(transport, channel) === 1, 'the first fragment held');
    await publishHeld(
      transport,
      channel,
      [await ticketed(parking, channel, heldFirst[1]), heldFirst[2]],
      PARTITIONS,
    );
    // ... or first, its inline fragments right behind it.
    const parked = bytes(3_000, 46);
    const parkedFirst = makeFragments('parked-first', parked, 1_000);
    await publishHeld(
      transport,
      channel,
      [await ticketed(parking, channel, parkedFirst[0]), ...parkedFirst.slice(1)],
      PARTITIONS,
    );

    await eventually(() => handler.deliveries.length === 2, 'both sequences handled', 3_000);
    expect(handler.of('held-mixed')[0].bytes.equals(held)).toBe(true);
    expect(handler.of('parked-first')[0].bytes.equals(parked)).toBe(true);
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');
    expect(deadLetters(transport, channel)).toHaveLength(0);
    expect(await spoolFiles(spoolDir)).toEqual([]);
    rmSync(root, { recursive: true, force: true });
  });

  it('dead-letters a late claim-checked fragment with a verdict whose marker never landed', async () => {
    const channel = 'held.mixed-unmarked';
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    const root = mkdtempSync(join(tmpdir(), 'nseq-parked-test-'));
    const expired: string[] = [];
    // The store takes fragments, but refuses every completion marker (Redis refusing writes).
    const store = new (class extends MemorySequenceStore {
      override async finish(): Promise<boolean> {
        throw new Error('the store refuses writes (test)');
      }
    })();
    t = await createSequenceTestApp(channel, {
      claimCheck: { store: new FilesystemPayloadStore({ root }) },
      sequence: {
        buffer: 'broker',
        partitions: PARTITIONS,
        spool: { dir: spoolDir },
        store,
        timeoutMs: 200,
        onExpired: (sequence: { sequenceId: string }) => void expired.push(sequence.sequenceId),
      },
    });
    const { transport, handler, app: nest } = t;
    const parking = nest.get<FragmentParking>(FRAGMENT_PARKING);
    const fragments = makeFragments('held-mixed-unmarked', bytes(3_000, 47), 1_000);
    // The inline fragments are held here and expire; their marker cannot be written.
    await publishHeld(transport, channel, [fragments[0], fragments[2]], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 2, 'two dead letters');
    // The claim-checked one comes late: it meets the verdict, as an inline one would.
    const late = await ticketed(parking, channel, fragments[1]);
    await publishHeld(transport, channel, [late], PARTITIONS);
    await eventually(() => deadLetters(transport, channel).length === 3, 'the late one refused');
    expect(String(deadLetters(transport, channel)[2].headers['x-death-reason'])).toMatch(
      /^sequence-expired: sequence held-mixed-unmarked: expired after 200 ms/,
    );
    expect(await openInStore(store)).toBe(0);
    await sleep(400); // a sequence opened in the store would expire there meanwhile, a second time
    expect(expired).toEqual(['held-mixed-unmarked']);
    expect(handler.calls).toBe(0);
    rmSync(root, { recursive: true, force: true });
  });

  it("dead-letters a claim-checked fragment carrying another fragment's ticket wrong-audience, never handing it over", async () => {
    const channel = 'held.forged-ticket';
    spoolDir = mkdtempSync(join(tmpdir(), 'nseq-spool-test-'));
    const root = mkdtempSync(join(tmpdir(), 'nseq-parked-test-'));
    t = await createSequenceTestApp(channel, {
      // Parked bodies kept past their ack: a forger holding copies of the tickets finds them.
      claimCheck: { store: new FilesystemPayloadStore({ root }), deleteAfter: 'ttl' },
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir: spoolDir } },
    });
    const { transport, handler, app: nest } = t;
    const parking = nest.get<FragmentParking>(FRAGMENT_PARKING);
    const payload = bytes(3_000, 48);
    const fragments = makeFragments('held-genuine', payload, 1_000);
    const sent = await Promise.all(
      fragments.map((fragment) => ticketed(parking, channel, fragment)),
    );
    const reasons = () => deadLetters(transport, channel).map((dead) => deathReasonOf(dead));

    // Fragment 2 of the sequence comes first with fragment 1's ticket (and checksum).
    await publishHeld(transport, channel, [sent[0]], PARTITIONS);
    await publishHeld(
      transport,
      channel,
      [
        {
          body: sent[0].body,
          headers: { ...sent[1].headers, 'x-fragment-crc32': crc32(fragments[0].body) },
        },
      ],
      PARTITIONS,
    );
    await eventually(() => reasons().length === 1, 'the forged fragment 2 refused');
    await publishHeld(transport, channel, sent.slice(1), PARTITIONS);
    await eventually(() => handler.deliveries.length === 1, 'the genuine sequence handled');
    // Then every ticket of the sequence, copied under another sequence's headers.
    const forged = sent.map(({ body, headers }) => ({
      body,
      headers: { ...headers, 'x-sequence-id': 'held-forged' },
    }));
    await publishHeld(transport, channel, forged, PARTITIONS);
    await eventually(() => reasons().length === 4, 'every forged fragment refused');
    await eventually(() => unsettledIn(transport, channel) === 0, 'every fragment settled');

    const [first, ...copies] = reasons();
    expect(first).toBe(
      'wrong-audience: the ticket was issued for sequence held-genuine fragment 1, not for ' +
        'sequence held-genuine fragment 2',
    );
    // Taken concurrently from their partition: in position order for the test.
    expect(copies.sort()).toEqual(
      [1, 2, 3].map(
        (position) =>
          `wrong-audience: the ticket was issued for sequence held-genuine fragment ${position}, ` +
          `not for sequence held-forged fragment ${position}`,
      ),
    );
    expect(handler.calls).toBe(1);
    expect(handler.of('held-genuine')[0].bytes.equals(payload)).toBe(true);
    expect(handler.of('held-forged')).toEqual([]);
    expect(await spoolFiles(spoolDir)).toEqual([]);
    rmSync(root, { recursive: true, force: true });
  });

  it('takes fragments published to the plain channel through the store', async () => {
    const channel = 'held.plain';
    const { transport, handler } = await app(channel);
    const payload = bytes(3_000, 13);
    for (const { body, headers } of makeFragments('held-plain', payload, 1_000)) {
      await transport.publish(channel, body, headers);
    }
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(handler.of('held-plain')[0].bytes.equals(payload)).toBe(true);
  });

  it("sends with buffer: 'broker' to the sequence's partition, end to end", async () => {
    const channel = 'held.splitter';
    const { splitter, handler, transport } = await app(channel);
    const payload = bytes(50_000, 14);
    const receipt = await splitter.send(channel, payload, {
      sequenceId: 'held-sent',
      fragmentBytes: 4_096,
    });
    await eventually(() => handler.deliveries.length === 1, 'handled');
    expect(receipt.fragments).toBe(13);
    expect(handler.of('held-sent')[0].bytes.equals(payload)).toBe(true);
    expect(transport.depth(channel)).toBe(0);
  });
});
