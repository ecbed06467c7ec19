import { Readable } from 'node:stream';
import { InMemoryTransport } from 'nest-sequence';
import { FaultInjectingTransport, bytes } from '../../test/support/sequence-test-app';
import { bootSplitter, closeSplitters } from '../../test/support/splitter-app';
import * as errors from '../core/errors/sequence-publish.error';

afterEach(closeSplitters);

const tick = async (n: number) => {
  for (let i = 0; i < n; i++) await Promise.resolve();
};

/**
 * SplitterService's publish loop when a publish fails for good: the source is closed by the time
 * send rejects, and no fragment goes to the transport after the failure was recorded, however
 * the failure and the source's next fragment interleave.
 */
describe('SplitterService: the publish loop after a publish failed for good', () => {
  it('has closed an async-iterable source (its finally ran) by the time send rejects after a publish failed for good', async () => {
    const faulty = new FaultInjectingTransport(new InMemoryTransport());
    faulty.beforePublish = () => {
      throw new Error('broker refused');
    };
    const splitter = await bootSplitter({
      transport: faulty,
      publish: { retry: { attempts: 1, baseDelayMs: 0 }, inFlight: 1 },
    });
    let closed = false;
    async function* source() {
      try {
        for (let i = 0; i < 100; i++) yield bytes(10, i);
      } finally {
        closed = true; // e.g. a DB cursor / file handle released
      }
    }
    const error = await splitter.send('scans', source(), { fragmentBytes: 10 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const closedAtRejection = closed;
    await tick(50);
    expect(error).toBeInstanceOf(errors.SequencePublishError);
    expect(closed).toBe(true); // eventually closed
    expect(closedAtRejection).toBe(true);
  });

  it('has destroyed a Readable source by the time send rejects after a publish failed for good', async () => {
    const faulty = new FaultInjectingTransport(new InMemoryTransport());
    faulty.beforePublish = () => {
      throw new Error('broker refused');
    };
    const splitter = await bootSplitter({
      transport: faulty,
      publish: { retry: { attempts: 1, baseDelayMs: 0 }, inFlight: 1 },
    });
    const source = Readable.from(Array.from({ length: 100 }, (_, i) => bytes(10, i)));
    const error = await splitter.send('scans', source, { fragmentBytes: 10 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const destroyedAtRejection = source.destroyed;
    await tick(50);
    expect(error).toBeInstanceOf(errors.SequencePublishError);
    expect(source.destroyed).toBe(true);
    expect(destroyedAtRejection).toBe(true);
  });

  it('publishes no fragment once a publish failed for good (sweep of microtask offsets)', async () => {
    const log: string[] = [];
    const Original = errors.SequencePublishError;
    class Recording extends Original {
      constructor(...args: ConstructorParameters<typeof Original>) {
        super(...args);
        log.push('failure');
      }
    }
    (errors as { SequencePublishError: unknown }).SequencePublishError = Recording;
    const hits: number[] = [];
    /** Per iteration: how many failures were recorded, and the position publishAll rejected on. */
    const failures: number[] = [];
    const rejectedAt: (number | string)[] = [];
    try {
      for (const order of ['gate-first', 'fail-first'] as const) {
        for (let k = 0; k < 40; k++) {
          log.length = 0;
          let rejectFirst!: (e: Error) => void;
          const faulty = new FaultInjectingTransport(new InMemoryTransport());
          faulty.beforePublish = (attempt) => {
            log.push(`publish:${attempt.position}`);
            if (attempt.position === 1) {
              return new Promise<void>((_, reject) => (rejectFirst = reject));
            }
            return undefined;
          };
          const splitter = await bootSplitter({
            transport: faulty,
            publish: { retry: { attempts: 1, baseDelayMs: 0 }, inFlight: 8 },
          });
          let gate!: () => void;
          let i = 0;
          const frag = (position: number) => ({
            body: Buffer.from([position]),
            position,
            headers: { 'x-sequence-position': position },
          });
          const iterable = {
            [Symbol.asyncIterator]() {
              return {
                next() {
                  i++;
                  if (i === 1) return Promise.resolve({ done: false, value: frag(1) });
                  if (i === 2) {
                    return new Promise((resolve) => {
                      gate = () => resolve({ done: false, value: frag(2) });
                    });
                  }
                  return Promise.resolve({ done: true, value: undefined });
                },
                return() {
                  return Promise.resolve({ done: true, value: undefined });
                },
              };
            },
          };
          const policy = {
            confirmTimeoutMs: 5_000,
            inFlight: 8,
            retry: { attempts: 1, baseDelayMs: 0, maxDelayMs: 0 },
          };
          const running = (
            splitter as unknown as {
              publishAll(...args: unknown[]): Promise<void>;
            }
          )
            .publishAll('ch', 'seq', iterable, policy, {}, undefined, () => undefined)
            .then(
              () => undefined,
              (error: unknown) => error,
            );
          await tick(20);
          if (order === 'gate-first') {
            gate();
            await tick(k);
            rejectFirst(new Error('refused'));
          } else {
            rejectFirst(new Error('refused'));
            await tick(k);
            gate();
          }
          const outcome = await running;
          failures.push(log.filter((entry) => entry === 'failure').length);
          rejectedAt.push(outcome instanceof Recording ? outcome.position : String(outcome));
          const failedAt = log.indexOf('failure');
          const secondAt = log.indexOf('publish:2');
          if (failedAt >= 0 && secondAt > failedAt) hits.push(order === 'gate-first' ? k : -k - 1);
          await closeSplitters();
        }
      }
    } finally {
      (errors as { SequencePublishError: unknown }).SequencePublishError = Original;
    }
    // Every iteration failed where intended: fragment 1's publish, once, recorded through the
    // patched constructor, and publishAll rejected with that failure. Without this, a patch that
    // stopped taking effect would leave `hits` empty however the loop behaved.
    expect(failures).toEqual(Array(80).fill(1));
    expect(rejectedAt).toEqual(Array(80).fill(1));
    // A fragment must never be handed to the transport after the failure was recorded.
    expect(hits).toEqual([]);
  });
});
