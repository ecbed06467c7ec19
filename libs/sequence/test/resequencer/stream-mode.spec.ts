import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { GapSweeper } from '../../src/resequencer/gap.sweeper';
import {
  InMemoryTransport,
  ResequencerService,
  SequencedHandler,
  SequenceModule,
  SplitterService,
  StreamedFragment,
  type SequencedHandlerOptions,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import { MessageRefusedError } from 'nest-sequence/microservices';
import {
  bytes,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
  shuffled,
  type TestFragment,
} from '../support/sequence-test-app';
import { mergeOptions } from '../support/merge-options';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { buildFragmentHeaders } from 'nest-sequence/wire';
import { crc32 } from '../../src/core/checksum';
import { deleteUnder, redisClient } from '../support/redis.fixture';
import { describeWithServer } from '../support/servers';

const channel = 'imaging.stream';
const dlq = `${channel}.dlq`;

/** `@SequencedHandler({ mode: 'stream' })` on embedded defaults: fragments in order, as they come. */
describe("@SequencedHandler({ mode: 'stream' })", () => {
  let app: INestApplicationContext;
  let transport: InMemoryTransport;
  let received: StreamedFragment[];
  /** Runs before a fragment is taken: a throw fails the call. */
  let beforeTaking: ((fragment: StreamedFragment) => void) | undefined;

  async function start(
    options: Partial<SequencedHandlerOptions> = {},
    moduleOptions: Partial<SequenceModuleOptions> = {},
  ) {
    received = [];
    transport = new InMemoryTransport();
    @Injectable()
    class StreamingReader {
      @SequencedHandler({ channel, mode: 'stream', ...options })
      read(fragment: StreamedFragment): void {
        beforeTaking?.(fragment);
        received.push(fragment);
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot(
          mergeOptions<SequenceModuleOptions>(
            { ...moduleOptions, transport },
            { tuning: { sweepers: { gaps: { intervalMs: false } } } },
          ),
        ),
      ],
      providers: [StreamingReader],
    }).compile();
    app = await moduleRef.init();
  }

  afterEach(async () => {
    beforeTaking = undefined;
    await app?.close();
    await transport?.close();
  });

  /** A sequence metric of the channel, as Prometheus would scrape it. */
  const sample = (name: string, labels: Record<string, string> = {}) =>
    metricValue(app.get(ModuleMetrics).registry, `nest_sequence_${name}`, { channel, ...labels });

  const positions = (sequenceId: string) =>
    received.filter((each) => each.sequenceId === sequenceId).map((each) => each.position);

  it('hands each fragment over in position order as soon as it is contiguous, then the verified last', async () => {
    await start();
    const payload = bytes(10_000, 3);
    const fragments = makeFragments('study-1', payload, 1_000, { modality: 'CT' });
    // 2..4 wait for 1; once 1 arrives, 1..4 go at once, before the rest has even been sent.
    await publishAll(transport, channel, [fragments[1], fragments[3], fragments[2]]);
    await eventually(() => transport.peek(channel).length === 0, 'three fragments taken');
    expect(received).toEqual([]);
    await publishAll(transport, channel, [fragments[0]]);
    await eventually(() => received.length === 4, 'fragments 1-4');
    expect(positions('study-1')).toEqual([1, 2, 3, 4]);

    await publishAll(transport, channel, shuffled(fragments.slice(4), 9));
    await eventually(() => received.length === 10, 'every fragment');
    expect(positions('study-1')).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    expect(Buffer.concat(received.map((each) => each.body))).toEqual(payload);
    const last = received[9];
    expect(last).toMatchObject({ last: true, verified: true, size: 10, totalBytes: 10_000 });
    expect(last.headers).toEqual({ modality: 'CT' });
    expect(received.slice(0, 9).every((each) => !each.last && each.verified === undefined)).toBe(
      true,
    );
  });

  it('delivers each fragment once, whatever the duplicates, and keeps sequences apart', async () => {
    await start();
    const a = makeFragments('a', bytes(3_000, 1), 1_000);
    const b = makeFragments('b', bytes(3_000, 2), 1_000);
    const all: TestFragment[] = [...a, ...b, a[0], b[2], a[1]];
    await publishAll(transport, channel, shuffled(all, 4));
    await eventually(() => received.length === 6, 'six fragments');
    await eventually(() => transport.peek(channel).length === 0, 'the channel drained');
    expect(positions('a')).toEqual([1, 2, 3]);
    expect(positions('b')).toEqual([1, 2, 3]);
  });

  it('streams what SplitterService sends', async () => {
    await start();
    const payload = bytes(50_000, 5);
    const receipt = await app.get(SplitterService).send(channel, payload, { fragmentBytes: 4_096 });
    await eventually(() => received.some((each) => each.last), 'the last fragment');
    expect(positions(receipt.sequenceId)).toEqual(
      Array.from({ length: receipt.fragments }, (_, i) => i + 1),
    );
    expect(Buffer.concat(received.map((each) => each.body))).toEqual(payload);
  });

  it('dead-letters a fragment whose body fails its CRC-32; the stream waits for a good copy', async () => {
    await start();
    const fragments = makeFragments('s', bytes(2_000, 6), 1_000);
    const corrupt = { body: Buffer.from(fragments[0].body), headers: fragments[0].headers };
    corrupt.body[0] ^= 0xff;
    await publishAll(transport, channel, [corrupt, fragments[1]]);
    await eventually(() => transport.peek(dlq).length === 1, 'the corrupt fragment refused');
    expect(String(transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(/^crc-mismatch: /);
    expect(received).toEqual([]);
    await publishAll(transport, channel, [fragments[0]]);
    await eventually(() => received.length === 2, 'both fragments');
    expect(positions('s')).toEqual([1, 2]);
  });

  it('honours maxSequenceBytes: refuses a declared total over it, and fragments streamed past it', async () => {
    await start({ maxSequenceBytes: 2_500 });
    const declared = makeFragments('declared', bytes(3_000, 8), 1_000);
    await publishAll(transport, channel, [declared[0]]);
    await eventually(() => transport.peek(dlq).length === 1, 'the declared total refused');
    expect(String(transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(
      /^sequence-too-large: sequence declared declares 3000 bytes/,
    );

    // Streamed, its total unknown until the end: the fragment that passes the limit is refused.
    const streamed = makeFragments('streamed', bytes(4_000, 9), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    await publishAll(transport, channel, streamed);
    await eventually(() => transport.peek(dlq).length === 3, 'fragments 3 and 4 refused');
    expect(positions('streamed')).toEqual([1, 2]);
    expect(
      transport
        .peek(dlq)
        .slice(1)
        .map((m) => String(m.headers['x-death-reason']).split(':')[0]),
    ).toEqual(['sequence-too-large', 'sequence-too-large']);
    // As reassembly counts them: the streamed sequence rejected once; fragments that declare too
    // much are refused alone, no sequence opened.
    expect(await sample('sequences_rejected_total', { reason: 'sequence-too-large' })).toBe(1);
  });

  it('counts the sequences it started and completed, and their latency, as reassembly does', async () => {
    await start();
    await publishAll(transport, channel, makeFragments('counted', bytes(3_000, 5), 1_000));
    await eventually(() => received.some((each) => each.last), 'the last fragment');

    expect(await sample('sequences_started_total')).toBe(1);
    expect(await sample('sequences_completed_total')).toBe(1);
    const latency = await metricValue(
      app.get(ModuleMetrics).registry,
      'nest_sequence_reassembly_latency_seconds_count',
      { channel },
    );
    expect(latency).toBe(1);
  });

  it('counts a failed handler call, not a fragment the handler refuses', async () => {
    await start({ handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 } });
    let failedOnce = false;
    beforeTaking = (fragment) => {
      if (fragment.sequenceId === 'flaky' && !failedOnce) {
        failedOnce = true;
        throw new Error('downstream unavailable (injected)');
      }
      if (fragment.sequenceId === 'refused') {
        throw new MessageRefusedError('invalid-payload', 'not a study (injected)');
      }
    };
    await publishAll(transport, channel, makeFragments('flaky', bytes(1_000, 2), 1_000));
    await publishAll(transport, channel, makeFragments('refused', bytes(1_000, 3), 1_000));
    await eventually(() => received.some((each) => each.sequenceId === 'flaky'), 'flaky taken');
    await eventually(() => transport.peek(dlq).length === 1, 'the refused fragment');

    expect(await sample('handler_failures_total')).toBe(1);
  });

  it("holds the fragments waiting for a gap within the channel's sequence budget", async () => {
    // Room for about two 1,000-byte fragments (with their headers and overhead), not six.
    const budget = 2_600;
    await start({}, { sequence: { maxBufferedBytes: budget, maxSequenceBytes: 2_000 } });
    const fragments = makeFragments('s', bytes(7_000, 10), 1_000);
    const streamed = fragments.map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    const resequencers = app.get(ResequencerService);
    await publishAll(transport, channel, streamed.slice(1, 7));
    await eventually(
      async () =>
        (await metricValue(
          app.get(ModuleMetrics).registry,
          'nest_sequence_resequencer_events_total',
          {
            resequencer: `sequence-stream:${channel}`,
            outcome: 'full',
          },
        )) > 0,
      'fragments past the budget back-pressured',
    );
    const held = (await resequencers.buffers())[`sequence-stream:${channel}`];
    expect(held.maxBytes).toBe(budget);
    expect(held.bytes).toBeLessThanOrEqual(budget);
    expect(held.events).toBeLessThan(6);
    expect(received).toEqual([]);
  });

  it('never hands over a last fragment whose payload fails its SHA-256: it is dead-lettered', async () => {
    await start();
    const fragments = makeFragments('tampered', bytes(3_000, 7), 1_000);
    const last = fragments[2];
    last.headers = { ...last.headers, 'x-sequence-sha256': '0'.repeat(64) };
    await publishAll(transport, channel, fragments);
    await eventually(() => transport.peek(dlq).length === 1, 'the last fragment refused');
    expect(positions('tampered')).toEqual([1, 2]);
    expect(String(transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(
      /^integrity-mismatch: sequence tampered: reassembled 3000 bytes/,
    );
  });

  it('refuses the last fragment again when its dead letter could not be sent the first time', async () => {
    await start(
      {},
      {
        publish: { retry: { attempts: 1 } },
      },
    );
    const fragments = makeFragments('tampered-twice', bytes(3_000, 8), 1_000);
    const last = fragments[2];
    last.headers = { ...last.headers, 'x-sequence-sha256': '0'.repeat(64) };
    const publish = transport.publish.bind(transport);
    let refusals = 1;
    transport.publish = (to, body, headers, options) =>
      to === dlq && refusals-- > 0
        ? Promise.reject(new Error('the dead-letter queue is full'))
        : publish(to, body, headers, options);

    await publishAll(transport, channel, fragments);
    // The hand-off item stays when its dead letter fails, and the fragment's message is requeued:
    // its redelivery drains the same last fragment again, which must be refused again (its check
    // not forgotten, nor turned into an unverifiable one).
    await eventually(() => transport.peek(dlq).length === 1, 'the last fragment refused');
    await transport.whenIdle();
    expect(refusals).toBeLessThan(0);
    expect(
      await metricValue(app.get(ModuleMetrics).registry, 'nest_sequence_sequences_rejected_total', {
        channel,
        reason: 'integrity-mismatch',
      }),
    ).toBe(1);

    expect(positions('tampered-twice')).toEqual([1, 2]);
    expect(received.some((fragment) => fragment.last)).toBe(false);
  });

  it('after timeout.ms, moves the fragments waiting behind a missing one to the dead-letter channel', async () => {
    await start({
      timeoutMs: 5_000,
    });
    const fragments = makeFragments('lost', bytes(4_000, 8), 1_000);
    await publishAll(transport, channel, [fragments[0], fragments[2], fragments[3]]);
    await eventually(() => received.length === 1, 'fragment 1');
    await eventually(() => transport.peek(channel).length === 0, 'the others buffered');
    await app.get(GapSweeper).sweep(Date.now() + 5_001);
    const moved = transport.peek(dlq);
    expect(moved.map((message) => message.headers['x-sequence-position'])).toEqual([3, 4]);
    expect(String(moved[0].headers['x-death-reason'])).toMatch(
      /^resequencer-gap-dead-letter: key lost: event 3 was buffered while 2 stayed missing/,
    );
    expect(received.some((each) => each.last)).toBe(false);
    // One sequence expired, however many of its fragments were moved out.
    expect(await sample('sequences_expired_total')).toBe(1);
  });

  /** A fragment at `position` of `sequenceId` that does not declare the sequence's size. */
  function strayFragment(sequenceId: string, position: number): Promise<void> {
    const body = Buffer.from(`stray ${position}`);
    const headers = buildFragmentHeaders({ sequenceId, position, last: false, crc32: crc32(body) });
    return transport.publish(channel, body, headers);
  }

  const reasons = () =>
    transport.peek(dlq).map((message) => String(message.headers['x-death-reason']));

  it('refuses a fragment past the last one it handed over: position-out-of-range', async () => {
    await start();
    await publishAll(transport, channel, makeFragments('ended', bytes(3_000, 3), 1_000));
    await eventually(() => received.some((each) => each.last), 'the last fragment');

    await strayFragment('ended', 4);
    await eventually(() => transport.peek(dlq).length === 1, 'the stray fragment dead-lettered');
    expect(positions('ended')).toEqual([1, 2, 3]);
    expect(reasons()).toEqual([
      expect.stringMatching(
        /^position-out-of-range: sequence ended fragment 4: the sequence ended at fragment 3/,
      ),
    ]);
  });

  it('refuses a fragment that waited behind the last one, once the last is handed over', async () => {
    await start();
    const fragments = makeFragments('behind', bytes(3_000, 4), 1_000);
    await publishAll(transport, channel, fragments.slice(0, 2));
    await strayFragment('behind', 4);
    await eventually(() => transport.peek(channel).length === 0, 'fragment 4 buffered');
    await publishAll(transport, channel, [fragments[2]]);

    await eventually(() => transport.peek(dlq).length === 1, 'fragment 4 dead-lettered');
    expect(positions('behind')).toEqual([1, 2, 3]);
    expect(reasons()).toEqual([
      expect.stringMatching(
        /^position-out-of-range: key behind, event 4: sequence behind fragment 4: the sequence ended at fragment 3/,
      ),
    ]);
    // Counted as a fragment refused on arrival is.
    expect(
      await metricValue(app.get(ModuleMetrics).registry, 'nest_sequence_fragments_rejected_total', {
        channel,
        reason: 'position-out-of-range',
      }),
    ).toBe(1);
  });

  const lost = makeFragments('lost', bytes(5_000, 8), 1_000);

  /** Fragment 2 never comes; 3 waits behind it past timeout.ms; then 4 and 5 (the last) come. */
  async function loseFragmentTwo(): Promise<void> {
    const fragments = lost;
    await publishAll(transport, channel, [fragments[0], fragments[2]]);
    await eventually(() => received.length === 1, 'fragment 1');
    await eventually(() => transport.peek(channel).length === 0, 'fragment 3 buffered');
    await app.get(GapSweeper).sweep(Date.now() + 5_001);
    await publishAll(transport, channel, [fragments[3], fragments[4]]);
    await eventually(() => transport.peek(dlq).length === 3, 'fragments 3, 4 and 5 dead-lettered');
  }

  it('dead-letters the fragments that come after the gap was given up: the handler never sees last', async () => {
    await start({ timeoutMs: 5_000 });
    await loseFragmentTwo();

    expect(received.map((each) => each.position)).toEqual([1]);
    const moved = transport.peek(dlq);
    expect(moved.map((message) => message.headers['x-sequence-position'])).toEqual([3, 4, 5]);
    expect(String(moved[1].headers['x-death-reason'])).toMatch(
      /^sequence-expired: key lost, event 4: the key was closed when the events behind its gap were dead-lettered/,
    );

    // Then fragment 1 again (a redelivery: dropped as a repeat) and the missing 2, too late.
    await publishAll(transport, channel, [lost[0], lost[1]]);
    await eventually(() => transport.peek(dlq).length === 4, 'fragment 2 dead-lettered');
    await transport.whenIdle();
    expect(transport.peek(dlq).map((message) => message.headers['x-sequence-position'])).toEqual([
      3, 4, 5, 2,
    ]);
    expect(received.map((each) => each.position)).toEqual([1]);
  });

  describeWithServer('redis', 'on a Redis resequencer store', () => {
    const redis = redisClient();
    const prefix = `nseq-test:stream-${Date.now()}`;

    afterAll(async () => {
      await deleteUnder(redis, prefix);
      await redis.quit();
    });

    it('dead-letters the fragments that come after the gap was given up', async () => {
      await start(
        { timeoutMs: 5_000 },
        { resequencer: { store: new RedisResequencerStore(redis, { prefix }) } },
      );
      await loseFragmentTwo();

      expect(received.map((each) => each.position)).toEqual([1]);
      expect(String(transport.peek(dlq)[2].headers['x-death-reason'])).toMatch(
        /^sequence-expired: key lost, event 5: /,
      );
    });
  });
});
