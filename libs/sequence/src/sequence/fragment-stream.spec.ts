import { SequenceEvents, type LifecycleEvent } from '../kernel/lifecycle-events';
import type { HandlerContext } from '../kernel/handler-call';
import type { OrderedEvent, OrderedIntake } from '../kernel/pattern-contracts';
import type { ResolvedSequenceConsumer } from '../options/resolved-options';
import { bytes, makeFragments } from '../../test/support/sequence-test-app';
import { FragmentStream } from './fragment-stream';
import { SequenceLifecycle } from './sequence.events';
import type { SequenceMetrics } from './sequence.metrics';

/**
 * Stream mode seen from one instance that delivers only the end of a sequence (its first fragments
 * went through another instance, or this one restarted): `sequence.completed` still reports the
 * sequence's bytes, which the last fragment declares.
 */
describe('FragmentStream: sequence.completed of a sequence this instance did not follow from fragment 1', () => {
  it('reports the bytes the last fragment declares, not 0', async () => {
    let deliver!: (event: OrderedEvent, context: HandlerContext) => unknown;
    const ordering: OrderedIntake = {
      defineIntake: (_definedBy, _definition, handler) => {
        deliver = handler;
        return { receive: async () => ({ action: 'ack' }) };
      },
    };
    const options = {
      timeout: { ms: 60_000, strategy: 'fixed' },
      maxSequenceBytes: 1024 * 1024,
      maxFragments: 1000,
      maxFragmentBytes: 1024 * 1024,
      maxHeaderBytes: 16 * 1024,
      handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
      handlerTimeoutMs: undefined,
      prefetch: 4,
      prefetchBytes: 4 * 1024 * 1024,
      buffer: 'store',
      partitions: 4,
      window: 1024,
    } as unknown as ResolvedSequenceConsumer;
    const metrics = new Proxy({}, { get: () => () => undefined }) as SequenceMetrics;
    const events = new SequenceEvents();
    const seen: LifecycleEvent[] = [];
    events.events$.subscribe((event) => seen.push(event));
    new FragmentStream(
      'stream.bytes',
      options,
      () => undefined,
      metrics,
      ordering,
      'Stream.handle',
      64 * 1024 * 1024,
      new SequenceLifecycle(events),
      3_600_000,
    );
    const fragments = makeFragments('second-half', bytes(2_500, 3), 1_000);
    const context = { signal: new AbortController().signal, attempt: 1 } as HandlerContext;

    // Fragments 1 and 2 were delivered by another instance; this one delivers the last.
    const last = fragments[2];
    await deliver({ key: 'second-half', seq: 3, body: last.body, headers: last.headers }, context);

    const completed = seen.find((event) => event.type === 'sequence.completed');
    expect(completed).toMatchObject({ sequenceId: 'second-half', fragments: 3, bytes: 2_500 });
  });
});
