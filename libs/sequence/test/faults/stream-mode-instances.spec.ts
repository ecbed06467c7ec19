import { randomUUID } from 'node:crypto';
import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { SequencedHandler, SequenceModule, StreamedFragment } from 'nest-sequence';
import { redisClient } from '../support/redis.fixture';
import { bytes, eventually, makeFragments, shuffled } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { namedTransport } from '../support/rabbitmq.fixture';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(60_000);

/** A fragment as one instance's handler received it, in the order the handlers ran. */
interface Handed {
  readonly instance: string;
  readonly fragment: StreamedFragment;
}

/**
 * `@SequencedHandler({ mode: 'stream' })` on RabbitMQ and a shared RedisResequencerStore, with two
 * instances (two Nest applications, each with its own connection and Redis client) consuming one
 * channel: each fragment reaches a handler once, in position order across both instances, and
 * `verified` on the last fragment says whether the instance that delivered it saw the whole
 * sequence.
 */
describeOnRealServers('faults: stream mode across two instances on RabbitMQ and Redis', () => {
  const apps: { app: INestApplicationContext; close(): Promise<void> }[] = [];
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      for (const each of apps.splice(0)) await each.close();
    },
  });

  async function startInstance(name: string, channel: string, handed: Handed[]) {
    const transport = await namedTransport(`nseq-fault-stream-${name}-${randomUUID()}`);
    const redis = redisClient();
    @Injectable()
    class StreamingReader {
      @SequencedHandler({ channel, mode: 'stream', prefetch: 2 })
      async read(fragment: StreamedFragment): Promise<void> {
        handed.push({ instance: name, fragment });
        // Slow enough that the other instance takes deliveries meanwhile.
        await new Promise((resolve) => setTimeout(resolve, 2));
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          resequencer: {
            store: new RedisResequencerStore(redis, { prefix: servers.prefix }),
          },
          tuning: {
            sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } },
            drain: { waitMs: 200 },
            backpressureDelayMs: 20,
          },
        }),
      ],
      providers: [StreamingReader],
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();
    apps.push({
      app,
      close: async () => {
        await app.close();
        await transport.close();
        await redis.quit();
      },
    });
  }

  it('hands every fragment over once, in position order, whichever instance took it; verified only when one instance delivered it all', async () => {
    const channel = servers.admin.newChannel();
    const handed: Handed[] = [];
    await startInstance('A', channel, handed);
    await startInstance('B', channel, handed);

    // Six sequences, so that the broker's spreading splits at least one between the instances
    // even when the machine is loaded (with three, all three once went whole to one instance).
    const payloads = [21, 22, 23, 24, 25, 26].map((seed) => bytes(40_000, seed));
    const sequences = payloads.map((payload, i) =>
      makeFragments(`study-${i}`, payload, 1_000, { modality: 'MR' }),
    );
    for (const fragment of shuffled(sequences.flat(), 5)) {
      await servers.producer.publish(channel, fragment.body, fragment.headers);
    }

    await eventually(
      () => handed.filter((each) => each.fragment.last).length === sequences.length,
      'the last fragment of every sequence',
      30_000,
    );
    const verified: boolean[] = [];
    for (const [i, payload] of payloads.entries()) {
      const mine = handed.filter((each) => each.fragment.sequenceId === `study-${i}`);
      // Once each, in order, across both instances.
      expect(mine.map((each) => each.fragment.position)).toEqual(
        Array.from({ length: 40 }, (_, p) => p + 1),
      );
      expect(Buffer.concat(mine.map((each) => each.fragment.body))).toEqual(payload);
      const last = mine[mine.length - 1];
      const oneInstance = mine.every((each) => each.instance === last.instance);
      expect(last.fragment).toMatchObject({ last: true, verified: oneInstance });
      verified.push(oneInstance);
      expect(last.fragment.headers).toEqual({ modality: 'MR' });
    }
    // Both instances took part (fragments were spread by the broker), within one sequence too:
    // at least one last fragment came unverified.
    expect(new Set(handed.map((each) => each.instance))).toEqual(new Set(['A', 'B']));
    expect(verified).toContain(false);
    expect(await servers.admin.readyCount(channel)).toBe(0);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
