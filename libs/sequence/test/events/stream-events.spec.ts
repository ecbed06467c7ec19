import { Injectable } from '@nestjs/common';
import { randomBytes } from 'node:crypto';
import {
  InMemoryTransport,
  MemoryResequencerStore,
  SequencedHandler,
  type LifecycleEvent,
  type StreamedFragment,
} from 'nest-sequence';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import { GapSweeper } from '../../src/resequencer/gap.sweeper';
import {
  bytes,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
} from '../support/sequence-test-app';
import { createTestApp, type TestApp } from '../support/test-app';
import { recordEvents } from './event-recorder';

/** Stream mode's lifecycle events under handler retries and time limits. */
describe('lifecycle events: stream mode', () => {
  let app: TestApp | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function boot(
    channel: string,
    handle: (fragment: StreamedFragment) => unknown,
    handler: {
      handlerRetry?: { attempts: number; baseDelayMs: number };
      handlerTimeoutMs?: number;
      timeoutMs?: number;
      maxSequenceBytes?: number;
    },
    store?: MemoryResequencerStore,
    publish?: { retry: { attempts: number } },
  ): Promise<{ transport: InMemoryTransport; app: TestApp }> {
    @Injectable()
    class StreamHandler {
      @SequencedHandler({ channel, mode: 'stream', ...handler })
      handle(fragment: StreamedFragment) {
        return handle(fragment);
      }
    }
    const transport = new InMemoryTransport();
    const booted = await createTestApp({
      sequence: {
        transport,
        ...(store && { resequencer: { store } }),
        ...(publish && { publish }),
        tuning: {
          sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } },
          backpressureDelayMs: 10,
        },
      },
      providers: [StreamHandler],
      logger: false,
      resources: [() => transport.close()],
    });
    return { transport, app: booted };
  }

  it('emits sequence.started once per sequence, not once per call of a retried first fragment', async () => {
    const channel = 'stream.retry';
    let calls = 0;
    const seen: number[] = [];
    const booted = await boot(
      channel,
      (fragment) => {
        calls++;
        // The first call of fragment 1 fails; the retry succeeds.
        if (fragment.position === 1 && calls === 1) throw new Error('transient');
        seen.push(fragment.position);
      },
      { handlerRetry: { attempts: 3, baseDelayMs: 1 } },
    );
    app = booted.app;
    const recorder = recordEvents(app.app);

    await publishAll(booted.transport, channel, makeFragments('retried', bytes(2_500, 4), 1_000));
    await eventually(() => seen.length === 3, 'three fragments streamed');
    await booted.transport.whenIdle();

    expect(recorder.only('sequence.started')).toHaveLength(1);
    expect(recorder.only('sequence.completed')).toHaveLength(1);
  });

  it('a last call that runs past handlerTimeoutMs: sequence.failed handler-timeout, and its late return completes nothing', async () => {
    const channel = 'stream.timeout';
    let returned = 0;
    const booted = await boot(
      channel,
      async () => {
        await new Promise((resolve) => setTimeout(resolve, 300));
        returned++;
      },
      { handlerRetry: { attempts: 1, baseDelayMs: 1 }, handlerTimeoutMs: 50 },
    );
    app = booted.app;
    const recorder = recordEvents(app.app);

    await publishAll(booted.transport, channel, makeFragments('slow', bytes(500, 4), 1_000));
    await eventually(() => returned === 1, 'the abandoned call returned');
    await booted.transport.whenIdle();
    await new Promise((resolve) => setTimeout(resolve, 50));

    const types = (events: LifecycleEvent[]) => events.map((event) => event.type);
    // The fragment itself was dead-lettered handler-timeout: the sequence failed.
    const dead = booted.transport.peek(`${channel}.dlq`);
    expect(dead.map((m) => String(m.headers['x-death-reason']))).toEqual([
      expect.stringMatching(/^handler-timeout/),
    ]);
    const failed = recorder.only('sequence.failed');
    expect(types(recorder.only('sequence.completed'))).toEqual([]);
    expect(failed).toHaveLength(1);
    expect(failed[0]).toMatchObject({ sequenceId: 'slow', reason: 'handler-timeout' });
    expect(types(recorder.events)).not.toContain('fragment.accepted');
  });

  it('reports each fragment the resequencer dead-letters as fragment.rejected, with the reason of its dead letter', async () => {
    const channel = 'stream.gap';
    const seen: number[] = [];
    const booted = await boot(channel, (fragment) => void seen.push(fragment.position), {
      timeoutMs: 5_000,
    });
    app = booted.app;
    const recorder = recordEvents(app.app);
    const fragments = makeFragments('lost', bytes(5_000, 8), 1_000);

    // Fragment 2 never comes: 3 waits behind it past timeoutMs and is dead-lettered with the
    // gap; 4 and 5 come after the sequence was given up.
    await publishAll(booted.transport, channel, [fragments[0], fragments[2]]);
    await eventually(() => seen.length === 1, 'fragment 1');
    await eventually(() => booted.transport.peek(channel).length === 0, 'fragment 3 buffered');
    await app.app.get(GapSweeper).sweep(Date.now() + 5_001);
    await publishAll(booted.transport, channel, [fragments[3], fragments[4]]);
    const dlq = `${channel}.dlq`;
    await eventually(
      () => booted.transport.peek(dlq).length === 3,
      'fragments 3, 4, 5 dead-lettered',
    );
    await booted.transport.whenIdle();

    const rejected = recorder.only('fragment.rejected');
    expect(rejected).toEqual([
      expect.objectContaining({
        channel,
        sequenceId: 'lost',
        position: 3,
        reason: 'resequencer-gap-dead-letter',
      }),
      expect.objectContaining({
        channel,
        sequenceId: 'lost',
        position: 4,
        reason: 'sequence-expired',
      }),
      expect.objectContaining({
        channel,
        sequenceId: 'lost',
        position: 5,
        reason: 'sequence-expired',
      }),
    ]);
    // Each event says what its dead letter says: `<reason>: <detail>`.
    const deathReasons = booted.transport
      .peek(dlq)
      .map((message) => [
        message.headers['x-sequence-position'],
        message.headers['x-death-reason'],
      ]);
    expect(
      rejected.map((event) =>
        event.type === 'fragment.rejected'
          ? [event.position, `${event.reason}: ${event.detail}`]
          : [],
      ),
    ).toEqual(deathReasons);
    expect(seen).toEqual([1]);
    // Counted as every refused fragment is.
    expect(await fragmentsRejected(channel, 'resequencer-gap-dead-letter')).toBe(1);
    expect(await fragmentsRejected(channel, 'sequence-expired')).toBe(2);
  });

  function fragmentsRejected(channel: string, reason: string) {
    return metricValue(
      app!.app.get(ModuleMetrics).registry,
      'nest_sequence_fragments_rejected_total',
      { channel, reason },
    );
  }

  it('reports a fragment that no longer decrypts in the resequencer store as fragment.rejected integrity-mismatch', async () => {
    const channel = 'stream.sealed';
    const seen: number[] = [];
    const store = new MemoryResequencerStore({
      encryption: { keys: [{ id: 'k1', key: randomBytes(32) }] },
    });
    const booted = await boot(channel, (fragment) => void seen.push(fragment.position), {}, store);
    app = booted.app;
    const recorder = recordEvents(app.app);
    const fragments = makeFragments('sealed', bytes(3_000, 9), 1_000);

    // Fragment 3 waits behind 2, sealed; its sealed bytes are then altered where they are held.
    await publishAll(booted.transport, channel, [fragments[2]]);
    await eventually(() => booted.transport.peek(channel).length === 0, 'fragment 3 buffered');
    const { keys } = store as unknown as {
      keys: {
        find(key: { scope: string; key: string }): { buffer: Map<number, { body: Buffer }> };
      };
    };
    keys.find({ scope: `sequence-stream:${channel}`, key: 'sealed' }).buffer.get(3)!.body[100] ^= 1;
    await publishAll(booted.transport, channel, [fragments[0], fragments[1]]);
    const dlq = `${channel}.dlq`;
    await eventually(() => booted.transport.peek(dlq).length === 1, 'fragment 3 dead-lettered');
    await booted.transport.whenIdle();

    expect(seen).toEqual([1, 2]);
    const [dead] = booted.transport.peek(dlq);
    expect(recorder.only('fragment.rejected')).toEqual([
      expect.objectContaining({
        channel,
        sequenceId: 'sealed',
        position: 3,
        reason: 'integrity-mismatch',
      }),
    ]);
    const [event] = recorder.only('fragment.rejected');
    if (event.type !== 'fragment.rejected') throw new Error(event.type);
    expect(`${event.reason}: ${event.detail}`).toBe(dead.headers['x-death-reason']);
  });

  it('reports each fragment refused for streaming past maxSequenceBytes as fragment.rejected, the sequence once as sequence.rejected', async () => {
    const channel = 'stream.large';
    const seen: number[] = [];
    const booted = await boot(
      channel,
      (fragment) => void seen.push(fragment.position),
      { maxSequenceBytes: 2_500 },
      undefined,
      { retry: { attempts: 1 } },
    );
    app = booted.app;
    const recorder = recordEvents(app.app);
    // Its total undeclared: only the fragments streamed past the limit tell.
    const fragments = makeFragments('large', bytes(4_000, 9), 1_000).map(({ body, headers }) => {
      const { ['x-sequence-bytes']: _bytes, ...rest } = headers;
      return { body, headers: rest };
    });
    // The first dead letter cannot be sent: fragment 3 comes back, and is refused again.
    const dlq = `${channel}.dlq`;
    const publish = booted.transport.publish.bind(booted.transport);
    let refusals = 1;
    booted.transport.publish = (to, body, headers, options) =>
      to === dlq && refusals-- > 0
        ? Promise.reject(new Error('the dead-letter queue is full'))
        : publish(to, body, headers, options);
    await publishAll(booted.transport, channel, fragments);
    await eventually(() => booted.transport.peek(dlq).length === 2, 'fragments 3 and 4 refused');
    await booted.transport.whenIdle();
    expect(refusals).toBeLessThan(0);

    expect(seen).toEqual([1, 2]);
    const outline = recorder
      .only('sequence.rejected', 'fragment.rejected')
      .map((event) => [
        event.type,
        event.type === 'fragment.rejected' ? event.position : undefined,
        event.type === 'sequence.rejected' || event.type === 'fragment.rejected'
          ? event.reason
          : undefined,
      ]);
    expect(outline).toEqual([
      ['sequence.rejected', undefined, 'sequence-too-large'],
      ['fragment.rejected', 3, 'sequence-too-large'],
      ['fragment.rejected', 4, 'sequence-too-large'],
    ]);
    expect(await fragmentsRejected(channel, 'sequence-too-large')).toBe(2);
  });
});
