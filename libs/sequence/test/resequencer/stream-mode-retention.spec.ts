import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  InMemoryTransport,
  ResequencerService,
  SequencedHandler,
  SequenceModule,
  StreamedFragment,
  type SequencedHandlerOptions,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { GapSweeper } from '../../src/resequencer/gap.sweeper';
import { RedisResequencerKeys } from '../../src/adapters/stores/redis/redis-resequencer-keys';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';
import { mergeOptions } from '../support/merge-options';
import { deleteUnder, redisClient } from '../support/redis.fixture';
import { describeWithServer } from '../support/servers';

const channel = 'imaging.kept';
const dlq = `${channel}.dlq`;
/** The resequencer stream mode orders `channel`'s fragments with. */
const resequencer = `sequence-stream:${channel}`;
/** `sequence.retentionMs`: how long a reassembled sequence's completion marker is kept. */
const RETENTION_MS = 1_000;

/**
 * What a sequence that ended leaves in the resequencer store in stream mode: its key's record,
 * which drops late copies of its fragments, for `sequence.retentionMs` (as reassembly keeps a
 * completion marker), not for the store's own retention (7 days).
 */
describe('stream mode: the resequencer key of a sequence that ended', () => {
  let app: INestApplicationContext;
  let transport: InMemoryTransport;
  let received: StreamedFragment[];

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
        received.push(fragment);
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot(
          mergeOptions<SequenceModuleOptions>(
            {
              transport,
              sequence: { retentionMs: RETENTION_MS },
              tuning: { sweepers: { gaps: { intervalMs: false } } },
            },
            { ...moduleOptions, transport },
          ),
        ),
      ],
      providers: [StreamingReader],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
  }

  afterEach(async () => {
    await app?.close();
    await transport?.close();
  });

  const positions = (sequenceId: string) =>
    received.filter((each) => each.sequenceId === sequenceId).map((each) => each.position);

  /** The key's state, read after the store has seen the time now (the memory store's clock). */
  async function keyNow(key: string) {
    const resequencers = app.get(ResequencerService);
    await resequencers.gapStats();
    return resequencers.inspect(resequencer, key);
  }

  it('drops late copies of a completed sequence for sequence.retentionMs, then forgets its key', async () => {
    await start();
    const fragments = makeFragments('done', bytes(3_000, 5), 1_000);
    await publishAll(transport, channel, fragments);
    await eventually(() => received.some((each) => each.last), 'the last fragment');
    await transport.whenIdle();

    // Copies within the horizon (a producer's retry, a redelivery): dropped, not handed over.
    await publishAll(transport, channel, [fragments[0], fragments[2]]);
    await transport.whenIdle();
    expect(positions('done')).toEqual([1, 2, 3]);
    expect(transport.peek(dlq)).toEqual([]);
    await expect(keyNow('done')).resolves.toMatchObject({ next: 4, buffered: [], handOff: 0 });

    await sleep(RETENTION_MS + 200);
    await expect(keyNow('done')).resolves.toEqual({ next: 1, buffered: [], handOff: 0 });
  });

  it('takes a new sequence under the id of one that ended once sequence.retentionMs passed, whole', async () => {
    await start();
    await publishAll(transport, channel, makeFragments('daily', bytes(3_000, 5), 1_000));
    await eventually(() => received.some((each) => each.last), 'the first sequence');
    await eventually(
      async () => (await keyNow('daily')).next === 1,
      "the first sequence's key let go and expired",
      RETENTION_MS + 5_000,
    );

    // Longer than the first: its fragments past the first one's end are its own.
    await publishAll(transport, channel, makeFragments('daily', bytes(5_000, 9), 1_000));
    await eventually(() => received.filter((each) => each.last).length === 2, 'the second one');

    expect(positions('daily')).toEqual([1, 2, 3, 1, 2, 3, 4, 5]);
    expect(transport.peek(dlq)).toEqual([]);
  });

  it('refuses late fragments of a sequence given up at a gap for sequence.retentionMs, then forgets its key', async () => {
    await start({ timeoutMs: 100 });
    const fragments = makeFragments('lost', bytes(4_000, 6), 1_000);
    await publishAll(transport, channel, [fragments[0], fragments[2]]);
    await eventually(() => received.length === 1, 'fragment 1');
    await eventually(() => transport.peek(channel).length === 0, 'fragment 3 buffered');
    await sleep(150);
    await app.get(GapSweeper).sweep();
    await eventually(() => transport.peek(dlq).length === 1, 'fragment 3 dead-lettered');

    // Within the horizon, a later fragment of the sequence is refused as expired.
    await publishAll(transport, channel, [fragments[3]]);
    await eventually(() => transport.peek(dlq).length === 2, 'fragment 4 dead-lettered');
    expect(String(transport.peek(dlq)[1].headers['x-death-reason'])).toMatch(/^sequence-expired: /);

    await sleep(RETENTION_MS + 200);
    await expect(keyNow('lost')).resolves.toEqual({ next: 1, buffered: [], handOff: 0 });
    expect(positions('lost')).toEqual([1]);
  });

  describeWithServer('redis', 'on a Redis resequencer store', () => {
    const redis = redisClient();
    const prefix = `nseq-test:stream-kept-${Date.now()}`;

    afterAll(async () => {
      await deleteUnder(redis, prefix);
      await redis.quit();
    });

    it("lets the key of a completed sequence expire with sequence.retentionMs, not the store's retention, and drops late copies until then", async () => {
      const retentionMs = 60_000;
      await start(
        {},
        {
          sequence: { retentionMs },
          resequencer: { store: new RedisResequencerStore(redis, { prefix }) },
        },
      );
      const fragments = makeFragments('done-redis', bytes(3_000, 7), 1_000);
      // Fragment 3 first: it waits behind a gap, so the key is in the scope's index too.
      await publishAll(transport, channel, [fragments[2], fragments[0], fragments[1]]);
      await eventually(() => received.some((each) => each.last), 'the last fragment');
      await transport.whenIdle();

      const keys = new RedisResequencerKeys(prefix);
      const state = keys.of({ scope: resequencer, key: 'done-redis' }).state;
      const ttlOf = async () => {
        const ttl = await redis.pttl(state);
        return ttl > 0 && ttl <= retentionMs * 1.1 + 1_000;
      };
      // The key is retired once its drain has settled, after the handler took the last fragment.
      await eventually(ttlOf, "the key's TTL shortened");
      // Nothing of the key left in the scope's index either.
      expect(await redis.hget(keys.index(resequencer).records, 'done-redis')).toBeNull();
      expect(await redis.zscore(keys.index(resequencer).activity, 'done-redis')).toBeNull();

      await publishAll(transport, channel, [fragments[0], fragments[1]]);
      await transport.whenIdle();
      expect(positions('done-redis')).toEqual([1, 2, 3]);
      expect(transport.peek(dlq)).toEqual([]);
    });
  });
});
