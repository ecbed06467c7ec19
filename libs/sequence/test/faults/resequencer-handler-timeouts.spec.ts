import type { HandlerContext } from 'nest-sequence';
import { eventually } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import {
  createResequencerApp,
  publishKeyedEvent,
  type ResequencerApp,
} from './support/resequencer-app';

jest.setTimeout(30_000);

const LEASE_MS = 600;
const TIMEOUT_MS = 50;
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

/**
 * Two instances on RabbitMQ and one Redis: a `@Resequenced` handler call that runs past
 * handlerTimeoutMs and ignores its signal is abandoned and its event dead-lettered, but the key's
 * next events wait for it, on whichever instance they arrive, for longer than the drain lease
 * lasts unrenewed: the instance that abandoned it keeps the lease until it returns.
 */
describeOnRealServers('faults: a @Resequenced handler that runs past handlerTimeoutMs', () => {
  const apps: ResequencerApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  it('never overlaps two calls for one key across instances, and keeps the drain lease meanwhile', async () => {
    const channel = servers.admin.newChannel();
    const definition = {
      channel,
      gap: GAP,
      handlerTimeoutMs: TIMEOUT_MS,
      handlerRetry: { attempts: 1 },
    };
    for (let i = 0; i < 2; i++) {
      apps.push(
        await createResequencerApp(definition, { prefix: servers.prefix, leaseMs: LEASE_MS }),
      );
    }
    let open!: () => void;
    const held = new Promise<void>((resolve) => (open = resolve));
    const calls: Array<{ seq: number; context: HandlerContext; app: ResequencerApp }> = [];
    let running = 0;
    let most = 0;
    for (const app of apps) {
      app.handler.onCall = async (event, context) => {
        calls.push({ seq: event.seq, context, app });
        most = Math.max(most, ++running);
        try {
          if (event.seq === 1) await held; // ignores its signal
        } finally {
          running--;
        }
      };
    }

    await publishKeyedEvent(apps[0].transport, channel, { key: 'K', seq: 1 });
    await eventually(() => calls[0]?.context.signal.aborted === true, 'the call to be abandoned');
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) >= 1,
      'event 1 to be dead-lettered',
    );
    // Event 2 as the other instance takes it from the broker; event 3 through the broker.
    const other = apps.find((app) => app !== calls[0].app)!;
    const receivingTwo = other.service.receive(channel, {
      body: Buffer.from('K#2'),
      headers: { 'x-resequence-key': 'K', 'x-resequence-seq': 2 },
    });
    await publishKeyedEvent(apps[0].transport, channel, { key: 'K', seq: 3 });
    await eventually(
      async () => (await other.service.inspect(channel, 'K')).next === 4,
      'events 2 and 3 to be released',
    );
    // Longer than the drain lease lasts unrenewed: were it not renewed, the other instance would
    // take the key over and call the handler with event 2 meanwhile.
    await new Promise((resolve) => setTimeout(resolve, 3 * LEASE_MS));

    expect(calls.map((call) => call.seq)).toEqual([1]);
    const dead = await servers.admin.drain(`${channel}.dlq`);
    // A dead-letter whose confirm came after confirmTimeoutMs (180 ms here, on a loaded machine)
    // is sent again: copies of it, at least once, and nothing else.
    const reasons = new Set(dead.map((message) => String(message.headers['x-death-reason'])));
    expect([...reasons]).toEqual([
      expect.stringMatching(
        new RegExp(`^handler-timeout: key K, event 1: handler timed out after ${TIMEOUT_MS} ms`),
      ),
    ]);

    open();
    await eventually(() => calls.length === 3, 'events 2 and 3 to be handled');
    // Told to wait (requeue) or handled: never dead-lettered, never lost.
    expect((await receivingTwo).action).not.toBe('dead-letter');

    expect(calls.map((call) => call.seq)).toEqual([1, 2, 3]);
    expect(calls.slice(1).every((call) => !call.context.signal.aborted)).toBe(true);
    expect(most).toBe(1);
  });
});
