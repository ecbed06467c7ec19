import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  InMemoryTransport,
  MemoryResequencerStore,
  SequencedHandler,
  SequenceModule,
  StreamedFragment,
  type SequencedHandlerOptions,
  type SequenceModuleOptions,
  type Transport,
} from 'nest-sequence';
import { buildFragmentHeaders } from 'nest-sequence/wire';
import { crc32 } from '../../src/core/checksum';
import type { HandOffItem } from 'nest-sequence/ports';
import {
  bytes,
  eventually,
  FaultInjectingTransport,
  makeFragments,
  publishAll,
} from '../support/sequence-test-app';
import { mergeOptions } from '../support/merge-options';
import { recordEvents, type EventRecorder } from '../events/event-recorder';
import { createHash } from 'node:crypto';

const channel = 'stream.rejected';

/** Hands back the body of the event at `seq` with one byte changed, as a store gone wrong might. */
class BodyChangingStore extends MemoryResequencerStore {
  constructor(private readonly seq: number) {
    super();
  }

  override async claimDrain(...args: Parameters<MemoryResequencerStore['claimDrain']>) {
    return this.changed(await super.claimDrain(...args));
  }

  override async settleDrain(...args: Parameters<MemoryResequencerStore['settleDrain']>) {
    return this.changed(await super.settleDrain(...args));
  }

  private changed<T extends { kind: string; items?: readonly HandOffItem[] }>(claim: T): T {
    if (claim.kind !== 'claimed' || !claim.items) return claim;
    const items = claim.items.map((item) => {
      if (item.kind !== 'event' || item.entry.seq !== this.seq) return item;
      const body = Buffer.from(item.entry.body);
      body[0] ^= 0xff;
      return { ...item, entry: { ...item.entry, body } };
    });
    return { ...claim, items };
  }
}
const dlq = `${channel}.dlq`;

describe('stream mode: after a fragment was refused', () => {
  let app: INestApplicationContext;
  let transport: InMemoryTransport;
  let received: StreamedFragment[];
  let recorder: EventRecorder;
  let fail: (fragment: StreamedFragment) => boolean;

  async function start(
    options: Partial<SequencedHandlerOptions> = {},
    moduleOptions: Partial<SequenceModuleOptions> = {},
    wrap: (inner: InMemoryTransport) => Transport = (inner) => inner,
  ) {
    received = [];
    fail = () => false;
    transport = new InMemoryTransport();
    @Injectable()
    class StreamingReader {
      @SequencedHandler({ channel, mode: 'stream', ...options })
      read(fragment: StreamedFragment): void {
        if (fail(fragment)) throw new Error('handler down');
        received.push(fragment);
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot(
          mergeOptions<SequenceModuleOptions>(
            { ...moduleOptions, transport: wrap(transport) },
            { tuning: { sweepers: { gaps: { intervalMs: false } } } },
          ),
        ),
      ],
      providers: [StreamingReader],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    recorder = recordEvents(app);
  }

  afterEach(async () => {
    recorder?.stop();
    await app?.close();
    await transport?.close();
  });

  const reasons = () =>
    transport.peek(dlq).map((message) => String(message.headers['x-death-reason']));

  /** A last fragment at `position` claiming the sequence has `position` fragments. */
  function lastAt(sequenceId: string, position: number, payload: Buffer) {
    const body = Buffer.from(`tail ${position}`);
    const sha256 = createHash('sha256')
      .update(Buffer.concat([payload, body]))
      .digest('hex');
    return {
      body,
      headers: buildFragmentHeaders({
        sequenceId,
        position,
        size: position,
        last: true,
        crc32: crc32(body),
        sha256,
      }),
    };
  }

  it('never hands over a last fragment, nor reports the sequence completed, once its last failed the SHA-256', async () => {
    await start();
    const payload = bytes(3_000, 7);
    const fragments = makeFragments('tampered', payload, 1_000);
    fragments[2].headers = { ...fragments[2].headers, 'x-sequence-sha256': '0'.repeat(64) };
    await publishAll(transport, channel, fragments);
    await eventually(() => transport.peek(dlq).length === 1, 'the last fragment refused');
    expect(String(transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(
      /^integrity-mismatch: /,
    );
    expect(recorder.only('sequence.rejected')).toHaveLength(1);

    // A contradicting fragment claiming to be the last one, past the refused last.
    await publishAll(transport, channel, [lastAt('tampered', 4, payload)]);
    await eventually(() => transport.peek(channel).length === 0, 'the stray fragment taken');
    await transport.whenIdle();

    // The handler must not see `last` of a sequence whose payload failed its check, and the
    // sequence, rejected integrity-mismatch, must not also be reported completed.
    expect(recorder.only('sequence.completed')).toEqual([]);
    expect(received.filter((each) => each.last)).toEqual([]);
    expect(received.map((each) => each.position)).toEqual([1, 2]);
  });

  it('never hands over a fragment whose body changed in the resequencer store', async () => {
    await start({}, { resequencer: { store: new BodyChangingStore(2) } });
    const fragments = makeFragments('changed-in-store', bytes(4_000, 8), 1_000);
    await publishAll(transport, channel, fragments);
    await eventually(() => received.some((each) => each.last), 'the last fragment');
    await transport.whenIdle();

    // As for any fragment dead-lettered: the later ones still come, the last not verified.
    expect(received.map((each) => each.position)).toEqual([1, 3, 4]);
    expect(reasons()).toEqual([
      expect.stringMatching(/^integrity-mismatch: .*position 2 read back from the store has crc32/),
    ]);
    expect(received[2].verified).not.toBe(true);
  });

  it('refuses a fragment past the end of a sequence whose last fragment was refused (integrity-mismatch)', async () => {
    await start();
    const payload = bytes(3_000, 9);
    const fragments = makeFragments('tampered-2', payload, 1_000);
    fragments[2].headers = { ...fragments[2].headers, 'x-sequence-sha256': '0'.repeat(64) };
    await publishAll(transport, channel, fragments);
    await eventually(() => transport.peek(dlq).length === 1, 'the last fragment refused');

    const body = Buffer.from('after the end');
    await transport.publish(
      channel,
      body,
      buildFragmentHeaders({
        sequenceId: 'tampered-2',
        position: 4,
        last: false,
        crc32: crc32(body),
      }),
    );
    await eventually(() => transport.peek(channel).length === 0, 'the stray fragment taken');
    await transport.whenIdle();
    expect(received.map((each) => each.position)).toEqual([1, 2]);
  });
  it('does not hand over the last fragment as verified when a fragment before it was dead-lettered handler-failed', async () => {
    await start({ handlerRetry: { attempts: 1 } });
    fail = (fragment) => fragment.position === 2;
    const fragments = makeFragments('holed', bytes(3_000, 11), 1_000);
    await publishAll(transport, channel, fragments);
    await eventually(() => received.some((each) => each.last), 'the last fragment');
    await transport.whenIdle();
    // Fragment 2 never reached the handler: it was dead-lettered handler-failed.
    expect(String(transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(/^handler-failed: /);
    expect(received.map((each) => each.position)).toEqual([1, 3]);
    // "verified: true when this instance hashed every fragment, in order, and the SHA-256 matched":
    // the handler did not get every fragment, so what it holds is not the verified payload.
    expect(received[1].verified).not.toBe(true);
  });
  it('emits sequence.rejected once for a sequence streamed past maxSequenceBytes (once per cluster)', async () => {
    await start({ maxSequenceBytes: 2_500 });
    const streamed = makeFragments('streamed', bytes(5_000, 9), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed);
    await eventually(() => transport.peek(dlq).length === 3, 'fragments 3, 4 and 5 refused');
    await transport.whenIdle();
    expect(received.map((each) => each.position)).toEqual([1, 2]);
    expect(
      recorder.only('sequence.rejected').map((event) => (event as { reason: string }).reason),
    ).toEqual(['sequence-too-large']);
  });

  it('emits sequence.rejected once when the dead letter of the fragment past the limit is sent again', async () => {
    let refusals = 1;
    const once = { publish: { retry: { attempts: 1 } } };
    await start({ maxSequenceBytes: 2_500 }, once, (inner) => {
      const faulty = new FaultInjectingTransport(inner);
      faulty.beforePublish = (attempt) => {
        // The first dead letter is refused: the fragment comes back and is refused again.
        if (attempt.channel === dlq && refusals-- > 0) throw new Error('dead-letter refused');
      };
      return faulty;
    });
    const streamed = makeFragments('again', bytes(3_000, 9), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed);
    await eventually(() => transport.peek(dlq).length === 1, 'fragment 3 refused');
    await transport.whenIdle();
    expect(refusals).toBeLessThan(0);
    expect(
      recorder.only('sequence.rejected').map((event) => (event as { reason: string }).reason),
    ).toEqual(['sequence-too-large']);
  });

  it('does not report a completed sequence as rejected when a stray fragment waited behind its last', async () => {
    await start();
    const fragments = makeFragments('behind', bytes(3_000, 4), 1_000);
    await publishAll(transport, channel, fragments.slice(0, 2));
    const body = Buffer.from('stray 4');
    await transport.publish(
      channel,
      body,
      buildFragmentHeaders({ sequenceId: 'behind', position: 4, last: false, crc32: crc32(body) }),
    );
    await eventually(() => transport.peek(channel).length === 0, 'fragment 4 buffered');
    await publishAll(transport, channel, [fragments[2]]);
    await eventually(() => transport.peek(dlq).length === 1, 'fragment 4 dead-lettered');
    await transport.whenIdle();
    expect(recorder.only('sequence.completed')).toHaveLength(1);
    // The sequence completed; only the stray fragment was refused (as it is when it comes after).
    expect(recorder.only('sequence.rejected')).toEqual([]);
  });
  it("back-pressures fragments past the channel's budget, whatever resequencer.overflow the module sets for its @Resequenced handlers", async () => {
    // Room for about two 1,000-byte fragments (with their headers and overhead), not six.
    await start(
      {},
      {
        sequence: { maxBufferedBytes: 2_600, maxSequenceBytes: 2_000 },
        resequencer: { overflow: 'dead-letter' },
      },
    );
    const streamed = makeFragments('budget', bytes(7_000, 10), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed.slice(1, 7));
    await eventually(() => transport.peek(channel).length < 6, 'fragments taken');
    await new Promise((resolve) => setTimeout(resolve, 200));
    // Stream mode at its budget: back-pressure (docs/security.md), never a dead letter that
    // leaves the sequence with a hole.
    expect(reasons()).toEqual([]);
  });

  it('refuses a sequence that declares more fragments than maxFragments from its first', async () => {
    await start({ maxFragments: 3 });
    // Five fragments, each declaring size 5 (makeFragments declares size and bytes).
    const fragments = makeFragments('declares-5', bytes(5_000, 3), 1_000);
    await publishAll(transport, channel, fragments);
    await eventually(() => transport.peek(channel).length === 0, 'taken');
    await transport.whenIdle();

    expect(received.map((fragment) => fragment.position)).toEqual([]);
    expect(new Set(reasons().map((reason) => reason.split(':')[0]))).toEqual(
      new Set(['too-many-fragments']),
    );
    expect(reasons()[0]).toMatch(/declared size 5 is beyond maxFragments \(3\)/);
    expect(recorder.only('sequence.rejected')).toHaveLength(1);
  });

  it('reports a sequence refused too-many-fragments as rejected, once', async () => {
    await start({ maxFragments: 3 });
    const all = makeFragments('many', bytes(5_000, 3), 1_000);
    // Streamed: no size until the last fragment.
    const streamed = all.map(({ body, headers }, index) => {
      if (index === all.length - 1) return { body, headers };
      const { ['x-sequence-size']: _size, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed);
    await eventually(() => transport.peek(channel).length === 0, 'taken');
    await transport.whenIdle();

    expect(received.map((fragment) => fragment.position)).toEqual([1, 2, 3]);
    expect(recorder.only('sequence.rejected')).toHaveLength(1);
  });

  it('hands over no fragment past the end of a sequence whose last was dead-lettered', async () => {
    await start({ handlerRetry: { attempts: 1 } });
    fail = (fragment) => fragment.last;
    await publishAll(transport, channel, makeFragments('failed-last', bytes(3_000, 5), 1_000));
    await eventually(() => transport.peek(dlq).length === 1, 'the last dead-lettered');
    await transport.whenIdle();
    const body = Buffer.from('after the end');
    await transport.publish(
      channel,
      body,
      buildFragmentHeaders({
        sequenceId: 'failed-last',
        position: 4,
        last: false,
        crc32: crc32(body),
      }),
    );
    await eventually(() => transport.peek(channel).length === 0, 'the stray taken');
    await transport.whenIdle();

    expect(received.map((fragment) => fragment.position)).toEqual([1, 2]);
    expect(reasons()[1]).toMatch(/^position-out-of-range/);
  });

  it('keeps counting streamed bytes against maxSequenceBytes after a fragment was dead-lettered', async () => {
    await start({ maxSequenceBytes: 2_500, handlerRetry: { attempts: 1 } });
    fail = (fragment) => fragment.position === 1;
    const streamed = makeFragments('uncounted', bytes(6_000, 9), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed);
    await eventually(() => transport.peek(channel).length === 0, 'taken');
    await transport.whenIdle();

    const handed = received.reduce((sum, fragment) => sum + fragment.body.length, 0);
    expect(handed).toBeLessThanOrEqual(2_500);
    expect(reasons().filter((reason) => reason.startsWith('sequence-too-large'))).not.toEqual([]);
  });
});
