import { closeSync, mkdtempSync, openSync, readSync, truncateSync, writeSync } from 'node:fs';
import { readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MemorySequenceStore, type Transport } from 'nest-sequence';
import { BrokerHeldReassembler } from '../../src/sequence/broker-held/broker-held.reassembler';
import { SpoolFile, type SpoolRange } from '../../src/sequence/broker-held/spool';
import { useBrokerAdmin } from '../support/broker-admin';
import { NatsAdmin, namedNatsTransport } from '../support/nats.fixture';
import { describeWithServer } from '../support/servers';
import { describeOnTransports, useTransportAdmin } from '../support/transports.fixture';
import {
  bytes,
  createSequenceTestApp,
  eventually,
  makeFragments,
  publishHeld,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import type { QueuedMessage } from '../support/broker-admin';
import { closeAll, type Closer } from '../support/test-app';

jest.setTimeout(30_000);

const PARTITIONS = 2;

/** What a disk does to a spool file between its writes and a read: the reads it was done to. */
function damageSpoolReads(damage: (path: string, ranges: readonly SpoolRange[]) => boolean): {
  damaged: number;
  reads: number;
} {
  const count = { damaged: 0, reads: 0 };
  const read = SpoolFile.prototype.read;
  jest.spyOn(SpoolFile.prototype, 'read').mockImplementation(function (
    this: SpoolFile,
    ...args: Parameters<SpoolFile['read']>
  ) {
    count.reads++;
    if (damage(this.path, args[0])) count.damaged++;
    return read.apply(this, args);
  });
  return count;
}

/** Flips every bit of the byte `at` in the file: bytes changed on disk after they were written. */
function flipByte(path: string, at: number): void {
  const fd = openSync(path, 'r+');
  try {
    const byte = Buffer.alloc(1);
    readSync(fd, byte, 0, 1, at);
    byte[0] ^= 0xff;
    writeSync(fd, byte, 0, 1, at);
  } finally {
    closeSync(fd);
  }
}

async function spoolFilesIn(dir: string): Promise<string[]> {
  const files: string[] = [];
  for (const entry of await readdir(dir).catch(() => [] as string[])) {
    files.push(...(await readdir(join(dir, entry)).catch(() => [] as string[])));
  }
  return files;
}

/** A store whose completion markers cannot be written; counts status reads per sequence. */
class UnmarkableStore extends MemorySequenceStore {
  readonly statuses = new Map<string, number>();

  override async status(
    ...args: Parameters<MemorySequenceStore['status']>
  ): ReturnType<MemorySequenceStore['status']> {
    const id = args[0].sequenceId;
    this.statuses.set(id, (this.statuses.get(id) ?? 0) + 1);
    return super.status(...args);
  }

  override async finish(): Promise<boolean> {
    throw new Error('the store refuses writes (test)');
  }
}

/**
 * Broker-held reassembly on the real brokers, whose transports let the reassembler release each
 * body once spooled: a sequence that fails or expires is still dead-lettered whole, every byte of
 * every fragment with the reason.
 */
describeOnTransports('guarantees: broker-held reassembly', [], (on) => {
  const broker = useTransportAdmin(on);
  /**
   * What the running test opened, in order: its consumer transport (the module does not close a
   * transport it was given), its spool directory and its app; closed last first after it.
   */
  const opened: Closer[] = [];
  let producer: Transport;
  let channel: string;

  beforeAll(async () => {
    producer = await on.connect('nseq-held-producer');
  });
  afterAll(async () => {
    await producer.close();
  });
  beforeEach(() => {
    channel = broker.admin.newChannel();
    broker.admin.partitioned(channel, PARTITIONS);
  });
  let spoolDir: string;
  afterEach(async () => {
    jest.restoreAllMocks();
    await closeAll(opened.splice(0));
  });

  async function app(
    sequence: Record<string, unknown>,
    handler: Record<string, unknown> = {},
  ): Promise<SequenceTestApp> {
    const transport = await on.connect('nseq-held-consumer');
    opened.push(() => transport.close());
    const dir = mkdtempSync(join(tmpdir(), 'nseq-held-'));
    spoolDir = dir;
    opened.push(() => rm(dir, { recursive: true, force: true }));
    const t = await createSequenceTestApp(channel, {
      transport,
      sequence: { buffer: 'broker', partitions: PARTITIONS, spool: { dir }, ...sequence },
      handler,
    });
    opened.push(() => t.close());
    return t;
  }

  async function deadLettersOf(count: number): Promise<QueuedMessage[]> {
    const letters: QueuedMessage[] = [];
    await eventually(
      async () => {
        letters.push(...(await broker.admin.drain(`${channel}.dlq`)));
        return letters.length >= count;
      },
      `${count} dead letters`,
      20_000,
    );
    return letters.sort(
      (a, b) => Number(a.headers['x-sequence-position']) - Number(b.headers['x-sequence-position']),
    );
  }

  it('dead-letters every fragment whole, with the reason, once the handler failed', async () => {
    const { handler } = await app({}, { handlerRetry: { attempts: 1 } });
    handler.failNext = 1;
    const fragments = makeFragments('held-fail', bytes(40_000, 31), 10_000);
    await publishHeld(producer, channel, fragments, PARTITIONS);

    const letters = await deadLettersOf(4);
    expect(letters.map((letter) => letter.body)).toEqual(fragments.map((f) => f.body));
    for (const letter of letters) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/^handler-failed: /);
    }
    expect(handler.calls).toBe(1);
  });

  it('dead-letters every fragment that arrived whole once the sequence expired', async () => {
    const { handler } = await app({ timeoutMs: 500 });
    const fragments = makeFragments('held-expired', bytes(40_000, 32), 10_000);
    await publishHeld(producer, channel, [fragments[0], fragments[2]], PARTITIONS);

    const letters = await deadLettersOf(2);
    expect(letters.map((letter) => letter.body)).toEqual([fragments[0].body, fragments[2].body]);
    for (const letter of letters) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/^sequence-expired: /);
    }
    expect(handler.calls).toBe(0);
  });

  it('dead-letters a sequence whose marker cannot be written, spooling it no more', async () => {
    const store = new UnmarkableStore();
    const t = await app({ timeoutMs: 300, store }, { handlerRetry: { attempts: 1 } });
    t.handler.failNext = 1;
    const failed = makeFragments('held-unmarked-failed', bytes(20_000, 42), 10_000);
    const expired = makeFragments('held-unmarked-expired', bytes(40_000, 41), 10_000);
    await publishHeld(producer, channel, [...failed, expired[0], expired[2]], PARTITIONS);

    const letters = await deadLettersOf(4);
    const reasons = letters.map((letter) => String(letter.headers['x-death-reason']));
    expect(reasons.filter((reason) => /^handler-failed: /.test(reason))).toHaveLength(2);
    expect(reasons.filter((reason) => /^sequence-expired: /.test(reason))).toHaveLength(2);
    expect(letters.map((letter) => letter.body).sort(Buffer.compare)).toEqual(
      [...failed, expired[0], expired[2]].map((f) => f.body).sort(Buffer.compare),
    );
    // Each opened once: neither was spooled again, nor its handler called again. The store is
    // asked at the opening, and again before a handler runs.
    expect(t.handler.calls).toBe(1);
    expect(Object.fromEntries(store.statuses)).toEqual({
      'held-unmarked-failed': 2,
      'held-unmarked-expired': 1,
    });
  });

  it('releases the body of a duplicate that comes while the first copy is still being spooled', async () => {
    const t = await app({});
    // A slow disk: the first copy's write is still under way when the duplicate comes.
    const write = SpoolFile.prototype.write;
    jest.spyOn(SpoolFile.prototype, 'write').mockImplementation(async function (
      this: SpoolFile,
      ...args: Parameters<SpoolFile['write']>
    ) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      return write.apply(this, args);
    });
    const fragments = makeFragments('held-dup-writing', bytes(30_000, 39), 10_000);
    // A producer that published the first fragment twice (a publish retried after a lost confirm).
    await publishHeld(producer, channel, [fragments[0], fragments[0], fragments[1]], PARTITIONS);

    const reassembler: unknown = t.app.get(BrokerHeldReassembler);
    const { held } = reassembler as {
      held: Map<string, { fragments: Map<number, { released: boolean; body?: Buffer }> }>;
    };
    const kept = () => [...held.values()].flatMap((sequence) => [...sequence.fragments.values()]);
    await eventually(
      () => kept().length === 2 && kept().every((fragment) => fragment.body === undefined),
      'both bodies spooled, none kept in memory',
      5_000,
    );
    expect(kept().map((fragment) => fragment.released)).toEqual([true, true]);

    await publishHeld(producer, channel, fragments.slice(2), PARTITIONS);
    await eventually(() => t.handler.deliveries.length === 1, 'handled', 10_000);
    expect(t.handler.of('held-dup-writing')[0].bytes.equals(bytes(30_000, 39))).toBe(true);
  });

  it('dead-letters a sequence whose spool cannot be read back, whole, after handlerRetry.attempts tries', async () => {
    const attempts = 2;
    const { handler } = await app({}, { handlerRetry: { attempts, baseDelayMs: 10 } });
    // The spool file lost its bytes on disk each time it is read back.
    const spool = damageSpoolReads((path) => {
      truncateSync(path, 0);
      return true;
    });
    const fragments = makeFragments('held-unreadable', bytes(40_000, 36), 10_000);
    await publishHeld(producer, channel, fragments, PARTITIONS);

    const letters = await deadLettersOf(4);
    expect(letters.map((letter) => letter.body)).toEqual(fragments.map((f) => f.body));
    for (const letter of letters) {
      expect(String(letter.headers['x-death-reason'])).toMatch(
        /^store-unavailable: sequence held-unreadable: failed 2 reads back from the spool/,
      );
    }
    // Spooled again from the broker for each try, read back once each, never delivered.
    expect(spool.reads).toBe(attempts);
    expect(handler.deliveries).toEqual([]);
    expect(await spoolFilesIn(spoolDir)).toEqual([]);
  });

  it('never hands over bytes changed in the spool: spools the sequence again from the broker', async () => {
    const { handler } = await app({});
    // The disk changes a byte of the second body once, after it was written.
    const spool = damageSpoolReads((path, ranges) => {
      if (spool.damaged > 0) return false;
      flipByte(path, ranges[1].offset + 17);
      return true;
    });
    const fragments = makeFragments('held-bitrot', bytes(40_000, 37), 10_000);
    await publishHeld(producer, channel, fragments, PARTITIONS);

    await eventually(() => handler.deliveries.length === 1, 'the sequence handled', 20_000);
    const payload = Buffer.concat(fragments.map((f) => f.body));
    expect(handler.of('held-bitrot')[0].bytes.equals(payload)).toBe(true);
    expect(spool.damaged).toBe(1);
    expect(handler.calls).toBe(2);
    await eventually(async () => (await spoolFilesIn(spoolDir)).length === 0, 'spool emptied');
    expect(await broker.admin.drain(`${channel}.dlq`)).toEqual([]);
  });

  it('dead-letters a sequence whose spooled bytes keep changing, whole, integrity-mismatch', async () => {
    const { handler } = await app({}, { handlerRetry: { attempts: 2, baseDelayMs: 10 } });
    const spool = damageSpoolReads((path, ranges) => {
      flipByte(path, ranges[2].offset);
      return true;
    });
    const fragments = makeFragments('held-bad-disk', bytes(40_000, 38), 10_000);
    await publishHeld(producer, channel, fragments, PARTITIONS);

    const letters = await deadLettersOf(4);
    expect(letters.map((letter) => letter.body)).toEqual(fragments.map((f) => f.body));
    for (const letter of letters) {
      expect(String(letter.headers['x-death-reason'])).toMatch(
        /^integrity-mismatch: sequence held-bad-disk: .*position 3 read back from the spool/,
      );
    }
    expect(spool.damaged).toBe(2);
    expect(handler.deliveries).toEqual([]);
  });

  it('hands a full window to the store, whole, and delivers both sequences', async () => {
    const { handler } = await app({ window: 4, partitions: 1 });
    broker.admin.partitioned(channel, 1);
    const a = makeFragments('win-a', bytes(3_000, 33), 1_000);
    const b = makeFragments('win-b', bytes(3_000, 34), 1_000);
    for (const fragment of [a[0], b[0], a[1], b[1], a[2], b[2]]) {
      await producer.publish(channel, fragment.body, fragment.headers, {
        partition: { index: 0, count: 1 },
      });
    }
    await eventually(() => handler.deliveries.length === 2, 'both handled', 20_000);
    expect(handler.of('win-a')[0].bytes.equals(Buffer.concat(a.map((f) => f.body)))).toBe(true);
    expect(handler.of('win-b')[0].bytes.equals(Buffer.concat(b.map((f) => f.body)))).toBe(true);
  });
});

/**
 * A graceful stop costs each held fragment one delivery, the one it was taking: the next instance
 * gets it as the server's next delivery. With `maxDeliver: 2` a sequence survives one restart;
 * a fragment handed back at its last delivery is not left where nothing delivers it again.
 */
describeWithServer('nats', 'broker-held reassembly on NATS JetStream: graceful stops', () => {
  const broker = useBrokerAdmin(() => NatsAdmin.connect());
  const opened: Closer[] = [];
  const store = new MemorySequenceStore();
  let producer: Transport;
  let channel: string;

  beforeAll(async () => {
    producer = await namedNatsTransport('nseq-held-producer');
  });
  afterAll(async () => {
    await producer.close();
  });
  beforeEach(() => {
    channel = broker.admin.newChannel();
    broker.admin.partitioned(channel);
  });
  afterEach(async () => {
    await closeAll(opened.splice(0));
  });

  async function instance(
    name: string,
    sequence: Record<string, unknown> = {},
  ): Promise<SequenceTestApp & { stop: () => Promise<void> }> {
    const transport = await namedNatsTransport(name, { transport: { maxDeliver: 2 } });
    opened.push(() => transport.close());
    const dir = mkdtempSync(join(tmpdir(), 'nseq-held-'));
    opened.push(() => rm(dir, { recursive: true, force: true }));
    const t = await createSequenceTestApp(channel, {
      transport,
      sequence: { buffer: 'broker', partitions: 1, spool: { dir }, store, ...sequence },
    });
    let stopped: Promise<void> | undefined;
    const stop = (): Promise<void> => (stopped ??= t.close().then(() => transport.close()));
    opened.push(stop);
    return { ...t, stop };
  }

  /** An instance that takes the two fragments published, then stops. */
  async function holdThenStop(name: string): Promise<void> {
    const holder = await instance(name);
    await eventually(
      () => holder.app.get(BrokerHeldReassembler).spooledBytes === 20_000,
      `two fragments spooled by ${name}`,
      10_000,
    );
    await holder.stop();
  }

  /**
   * Publishes two of a sequence's four fragments; `stops` instances in turn take them and stop;
   * then the rest are published and the next instance must complete the sequence, nothing
   * dead-lettered.
   */
  async function completesAfter(stops: number, sequenceId: string): Promise<void> {
    const fragments = makeFragments(sequenceId, bytes(40_000, 35 + stops), 10_000);
    await publishHeld(producer, channel, fragments.slice(0, 2), 1);
    for (let stop = 1; stop <= stops; stop++) await holdThenStop(`nseq-held-${stop}`);

    const last = await instance('nseq-held-last');
    await publishHeld(producer, channel, fragments.slice(2), 1);
    await eventually(() => last.handler.deliveries.length === 1, 'the sequence handled', 20_000);
    const payload = Buffer.concat(fragments.map((f) => f.body));
    expect(last.handler.of(sequenceId)[0].bytes.equals(payload)).toBe(true);
    expect(await broker.admin.drain(`${channel}.dlq`)).toEqual([]);
  }

  it('hands each held fragment back once, so the next instance completes it', async () => {
    await completesAfter(1, 'held-restart');
  });

  it('dead-letters a sequence that expires at its last delivery with the expiry named', async () => {
    const fragments = makeFragments('held-expires', bytes(40_000, 38), 10_000);
    await publishHeld(producer, channel, fragments.slice(0, 2), 1);
    await holdThenStop('nseq-held-1');
    // The second delivery, the last: the fragments cannot come back to meet the verdict.
    await instance('nseq-held-2', { timeoutMs: 300 });

    const letters: QueuedMessage[] = [];
    await eventually(
      async () => {
        letters.push(...(await broker.admin.drain(`${channel}.dlq`)));
        return letters.length >= 2;
      },
      'two dead letters',
      20_000,
    );
    for (const letter of letters) {
      expect(String(letter.headers['x-death-reason'])).toMatch(/sequence-expired/);
    }
    const bodies = letters.map((letter) => letter.body).sort(Buffer.compare);
    expect(bodies).toEqual([fragments[0].body, fragments[1].body].sort(Buffer.compare));
  });

  it('puts a fragment handed back at its last delivery at the tail, not out of reach', async () => {
    // The second stop hands the two fragments back at their last delivery.
    await completesAfter(2, 'held-last');
  });
});
