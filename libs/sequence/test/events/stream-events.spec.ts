import { Injectable } from '@nestjs/common';
import {
  InMemoryTransport,
  SequencedHandler,
  type LifecycleEvent,
  type StreamedFragment,
} from 'nest-sequence';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';
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
    },
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
});
