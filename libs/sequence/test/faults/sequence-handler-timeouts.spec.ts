import type { HandlerContext } from 'nest-sequence';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(30_000);

const TIMEOUT_MS = 50;

/**
 * A @SequencedHandler that never returns, on RabbitMQ and a Redis sequence store: each call is
 * abandoned at handlerTimeoutMs, the sequence is dead-lettered handler-timeout once the retries
 * are spent, and its completing fragment is settled: the handler holds neither the message nor the
 * completion lease.
 */
describeOnRealServers(
  'faults: a @SequencedHandler that never returns, with handlerTimeoutMs',
  () => {
    let app: RealServersApp | undefined;
    const servers = useFaultServers({
      beforeCleanup: async () => {
        await app?.close();
        app = undefined;
      },
    });

    it('is retried, then the sequence is dead-lettered handler-timeout and its message settled', async () => {
      const channel = servers.admin.newChannel();
      app = await createRealServersApp(channel, {
        prefix: servers.prefix,
        handler: {
          handlerTimeoutMs: TIMEOUT_MS,
          handlerRetry: { attempts: 2, baseDelayMs: 1, maxDelayMs: 1 },
        },
      });
      const contexts: HandlerContext[] = [];
      app.handler.onCall = (_payload, context) => {
        contexts.push(context);
        return new Promise<void>(() => undefined); // never settles, ignores its signal
      };

      const fragments = makeFragments('stuck', bytes(4_000, 5), 1_000);
      await publishAll(app.transport, channel, fragments);
      await eventually(
        async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 1,
        'the sequence to be dead-lettered',
        10_000,
      );

      expect(contexts.map((context) => context.attempt)).toEqual([1, 2]);
      expect(contexts.every((context) => context.signal.aborted)).toBe(true);
      const [dead] = await servers.admin.drain(`${channel}.dlq`);
      expect(String(dead.headers['x-death-reason'])).toBe(
        `handler-timeout: sequence stuck: handler timed out after ${TIMEOUT_MS} ms ` +
          '(handlerTimeoutMs) on its last call, after 2 call(s) failed',
      );
      expect(dead.headers['x-sequence-last']).toBe(true);
      expect(await servers.admin.readyCount(channel)).toBe(0);
      // The sequence was finished as failed, its lease let go: a late copy of its last fragment
      // meets that verdict at once, and the handler is not called again.
      await publishAll(app.transport, channel, fragments.slice(-1));
      await eventually(
        async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 1,
        'the late copy to be dead-lettered',
        10_000,
      );
      const [late] = await servers.admin.drain(`${channel}.dlq`);
      expect(late.headers['x-death-reason']).toBe(dead.headers['x-death-reason']);
      expect(contexts).toHaveLength(2);
    });
  },
);
