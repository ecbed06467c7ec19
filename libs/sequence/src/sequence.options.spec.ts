import { Registry } from 'prom-client';
import { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
import { SequenceOptionsError } from './core/errors/sequence-options.error';
import {
  SEQUENCE_DEFAULTS,
  resolveConsumerOptions,
  resolveSequenceOptions,
  type SequenceModuleOptions,
} from './sequence.options';

const KiB = 1024;
const MiB = 1024 * KiB;

/** The problems `resolveSequenceOptions` reports for `options`, or [] when it accepts them. */
function problemsOf(options: SequenceModuleOptions, transport = new InMemoryTransport()): string[] {
  try {
    resolveSequenceOptions(options, transport);
    return [];
  } catch (error) {
    if (!(error instanceof SequenceOptionsError)) throw error;
    return [...error.problems];
  }
}

/** Lets a test pass a value of the wrong type, as a config file or the environment would. */
const untyped = <T>(value: unknown): T => value as T;

describe('resolveSequenceOptions', () => {
  describe('defaults', () => {
    it('applies every documented default', () => {
      const resolved = resolveSequenceOptions({}, new InMemoryTransport());

      expect(resolved).toMatchObject({
        fragmentBytes: 16 * MiB - 16 * KiB,
        headerAllowanceBytes: 16 * KiB,
        publish: {
          confirmTimeoutMs: 10_000,
          attempts: 5,
          baseDelayMs: 100,
          maxDelayMs: 5_000,
          inFlight: 2,
        },
        timeout: { ms: 300_000, strategy: 'fixed' },
        maxSequenceBytes: 512 * MiB,
        maxFragments: 100_000,
        maxFragmentBytes: 16 * MiB,
        handlerRetry: { attempts: 3, baseDelayMs: 200 },
        prefetch: 16,
        prefetchBytes: 32 * MiB,
        maxBufferedBytes: 1024 * MiB,
        maxOpenSequences: 10_000,
        backpressureDelayMs: 500,
        leaseMs: 30_000,
        retentionMs: 3_600_000,
        sweepIntervalMs: 1_000,
        metrics: { prefix: 'nest_sequence_' },
      });
      expect(resolved.deadLetterChannel).toBeUndefined();
      expect(resolved.onExpired).toBeUndefined();
    });

    it('exports the same defaults as SEQUENCE_DEFAULTS', () => {
      const resolved = resolveSequenceOptions({}, new InMemoryTransport());

      expect(resolved.publish).toEqual(SEQUENCE_DEFAULTS.publish);
      expect(resolved.timeout).toEqual(SEQUENCE_DEFAULTS.timeout);
      expect(resolved.handlerRetry).toEqual(SEQUENCE_DEFAULTS.handlerRetry);
      expect(resolved.headerAllowanceBytes).toBe(SEQUENCE_DEFAULTS.headerAllowanceBytes);
    });

    it('derives fragmentBytes and maxFragmentBytes from the transport', () => {
      const transport = new InMemoryTransport({ maxMessageBytes: 100_000 });

      const resolved = resolveSequenceOptions({ headerAllowanceBytes: 1_000 }, transport);

      expect(resolved.fragmentBytes).toBe(99_000);
      expect(resolved.maxFragmentBytes).toBe(100_000);
    });

    it('names this instance <hostname>-<pid>-<random> unless told', () => {
      const first = resolveSequenceOptions({}, new InMemoryTransport()).consumerId;
      const second = resolveSequenceOptions({}, new InMemoryTransport()).consumerId;

      expect(first).toContain(`-${process.pid}-`);
      expect(first).not.toBe(second);
      expect(
        resolveSequenceOptions({ consumerId: 'pod-7' }, new InMemoryTransport()).consumerId,
      ).toBe('pod-7');
    });
  });

  describe('overrides', () => {
    it('merges a partial publish policy with the defaults', () => {
      const resolved = resolveSequenceOptions(
        { publish: { attempts: 9, inFlight: 4 } },
        new InMemoryTransport(),
      );

      expect(resolved.publish).toEqual({ ...SEQUENCE_DEFAULTS.publish, attempts: 9, inFlight: 4 });
    });

    it('treats undefined fields as absent, so they keep their defaults', () => {
      const resolved = resolveSequenceOptions(
        {
          fragmentBytes: undefined,
          publish: { attempts: undefined, confirmTimeoutMs: 50 },
          timeout: { ms: undefined, strategy: 'sliding' },
          handlerRetry: { attempts: undefined },
          maxBufferedBytes: undefined,
        },
        new InMemoryTransport(),
      );

      expect(resolved.fragmentBytes).toBe(16 * MiB - 16 * KiB);
      expect(resolved.publish).toEqual({ ...SEQUENCE_DEFAULTS.publish, confirmTimeoutMs: 50 });
      expect(resolved.timeout).toEqual({ ms: 300_000, strategy: 'sliding' });
      expect(resolved.handlerRetry).toEqual(SEQUENCE_DEFAULTS.handlerRetry);
      expect(resolved.maxBufferedBytes).toBe(1024 * MiB);
    });

    it('keeps the values it is given', () => {
      const registry = new Registry();
      const onExpired = (): void => undefined;

      const resolved = resolveSequenceOptions(
        {
          fragmentBytes: 4_096,
          maxSequenceBytes: 10 * MiB,
          maxBufferedBytes: 20 * MiB,
          deadLetterChannel: 'graveyard',
          sweepIntervalMs: false,
          onExpired,
          metrics: { registry, prefix: 'imaging_' },
        },
        new InMemoryTransport(),
      );

      expect(resolved).toMatchObject({
        fragmentBytes: 4_096,
        maxSequenceBytes: 10 * MiB,
        maxBufferedBytes: 20 * MiB,
        deadLetterChannel: 'graveyard',
        sweepIntervalMs: false,
        onExpired,
        metrics: { registry, prefix: 'imaging_' },
      });
    });

    it('turns metrics off with metrics: false', () => {
      expect(resolveSequenceOptions({ metrics: false }, new InMemoryTransport()).metrics).toBe(
        false,
      );
    });
  });

  describe('validation', () => {
    it.each<[string, SequenceModuleOptions, string]>([
      [
        'a fragmentBytes that does not fit the transport',
        { fragmentBytes: 16 * MiB },
        `fragmentBytes (${16 * MiB}) plus headerAllowanceBytes (16384) exceeds the in-memory ` +
          `transport's maxMessageBytes (${16 * MiB}); set fragmentBytes to at most 16760832`,
      ],
      ['fragmentBytes 0', { fragmentBytes: 0 }, 'fragmentBytes must be an integer >= 1, got 0'],
      [
        'a metrics.prefix Prometheus would refuse',
        { metrics: { prefix: 'imaging-' } },
        'metrics.prefix must be empty or a Prometheus metric name (letters, digits, _ and :, ' +
          'not starting with a digit), got "imaging-"',
      ],
      [
        'a fractional fragmentBytes',
        { fragmentBytes: 1.5 },
        'fragmentBytes must be an integer >= 1, got 1.5',
      ],
      [
        'a negative headerAllowanceBytes',
        { headerAllowanceBytes: -1 },
        'headerAllowanceBytes must be an integer >= 0, got -1',
      ],
      [
        'publish.confirmTimeoutMs 0',
        { publish: { confirmTimeoutMs: 0 } },
        'publish.confirmTimeoutMs must be an integer >= 1, got 0',
      ],
      [
        'publish.attempts 0',
        { publish: { attempts: 0 } },
        'publish.attempts must be an integer >= 1, got 0',
      ],
      [
        'a negative publish.baseDelayMs',
        { publish: { baseDelayMs: -1 } },
        'publish.baseDelayMs must be an integer >= 0, got -1',
      ],
      [
        'a negative publish.maxDelayMs',
        { publish: { maxDelayMs: -1 } },
        'publish.maxDelayMs must be an integer >= 0, got -1',
      ],
      [
        'publish.inFlight 0',
        { publish: { inFlight: 0 } },
        'publish.inFlight must be an integer >= 1, got 0',
      ],
      ['timeout.ms 0', { timeout: { ms: 0 } }, 'timeout.ms must be an integer >= 1, got 0'],
      [
        'an unknown timeout.strategy',
        { timeout: { strategy: untyped('lazy') } },
        "timeout.strategy must be 'fixed' or 'sliding', got lazy",
      ],
      [
        'handlerRetry.attempts 0',
        { handlerRetry: { attempts: 0 } },
        'handlerRetry.attempts must be an integer >= 1, got 0',
      ],
      [
        'a negative handlerRetry.baseDelayMs',
        { handlerRetry: { baseDelayMs: -1 } },
        'handlerRetry.baseDelayMs must be an integer >= 0, got -1',
      ],
      [
        'maxSequenceBytes 0',
        { maxSequenceBytes: 0 },
        'maxSequenceBytes must be an integer >= 1, got 0',
      ],
      ['maxFragments 0', { maxFragments: 0 }, 'maxFragments must be an integer >= 1, got 0'],
      [
        'maxFragmentBytes 0',
        { maxFragmentBytes: 0 },
        'maxFragmentBytes must be an integer >= 1, got 0',
      ],
      ['prefetch 0', { prefetch: 0 }, 'prefetch must be an integer >= 1, got 0'],
      ['prefetchBytes 0', { prefetchBytes: 0 }, 'prefetchBytes must be an integer >= 1, got 0'],
      [
        'a prefetch above what RabbitMQ takes',
        { prefetch: 65_536 },
        'prefetch must be at most 65535, got 65536',
      ],
      [
        'an empty deadLetterChannel',
        { deadLetterChannel: '' },
        'deadLetterChannel must not be empty',
      ],
      [
        'maxBufferedBytes 0',
        { maxBufferedBytes: 0 },
        'maxBufferedBytes must be an integer >= 1, got 0',
      ],
      [
        'maxOpenSequences 0',
        { maxOpenSequences: 0 },
        'maxOpenSequences must be an integer >= 1, got 0',
      ],
      [
        'a negative backpressureDelayMs',
        { backpressureDelayMs: -1 },
        'backpressureDelayMs must be an integer >= 0, got -1',
      ],
      ['leaseMs below 100', { leaseMs: 99 }, 'leaseMs must be an integer >= 100, got 99'],
      ['retentionMs 0', { retentionMs: 0 }, 'retentionMs must be an integer >= 1, got 0'],
      [
        'sweepIntervalMs 0',
        { sweepIntervalMs: 0 },
        'sweepIntervalMs must be an integer >= 1, got 0',
      ],
      // Past 2^31 - 1 ms Node fires a timer after 1 ms: the sweep would spin.
      [
        'a sweepIntervalMs no timer can wait',
        { sweepIntervalMs: 2 ** 31 },
        'sweepIntervalMs must be at most 2147483647 ms (the longest a timer waits), got 2147483648',
      ],
      [
        'a confirm timeout no timer can wait',
        { publish: { confirmTimeoutMs: 2 ** 32 } },
        'publish.confirmTimeoutMs must be at most 2147483647 ms (the longest a timer waits), got 4294967296',
      ],
      [
        'a maxSequenceBytes above maxBufferedBytes',
        { maxSequenceBytes: 2_000, maxBufferedBytes: 1_000 },
        'maxSequenceBytes (2000) exceeds maxBufferedBytes (1000): such a sequence could never ' +
          'be buffered whole; raise maxBufferedBytes or lower maxSequenceBytes',
      ],
      [
        'an onExpired that is not a function',
        { onExpired: untyped('log it') },
        'onExpired must be a function',
      ],
      [
        'a consumerId with forbidden characters',
        { consumerId: 'pod 7' },
        'consumerId must be 1-128 characters of [A-Za-z0-9._:-]',
      ],
    ])('refuses %s', (_, options, problem) => {
      expect(problemsOf(options)).toContain(problem);
    });

    it('refuses a number given as a string, as the environment would supply it', () => {
      const problems = problemsOf({ fragmentBytes: untyped('4096') });

      expect(problems).toHaveLength(1);
      expect(problems[0]).toMatch(/^fragmentBytes must be an integer >= 1/);
    });

    it('reports every problem at once, in one SequenceOptionsError', () => {
      let error: unknown;
      try {
        resolveSequenceOptions(
          { prefetch: 0, leaseMs: 1, timeout: { strategy: untyped('never') } },
          new InMemoryTransport(),
        );
      } catch (caught) {
        error = caught;
      }

      expect(error).toBeInstanceOf(SequenceOptionsError);
      const optionsError = error as SequenceOptionsError;
      expect(optionsError.name).toBe('SequenceOptionsError');
      expect(optionsError.where).toBe('SequenceModule options');
      expect(optionsError.problems).toHaveLength(3);
      for (const problem of optionsError.problems) {
        expect(optionsError.message).toContain(problem);
      }
    });

    it('accepts the defaults and sweepIntervalMs: false', () => {
      expect(problemsOf({})).toEqual([]);
      expect(problemsOf({ sweepIntervalMs: false })).toEqual([]);
    });
  });
});

describe('resolveConsumerOptions', () => {
  const base = resolveSequenceOptions(
    { maxBufferedBytes: 100 * MiB, maxSequenceBytes: 50 * MiB, prefetch: 8 },
    new InMemoryTransport(),
  );

  it("applies a handler's overrides on top of the module's options", () => {
    const resolved = resolveConsumerOptions(
      'sequence consumer of scans',
      { timeout: { ms: 60_000 }, prefetch: 2, deadLetterChannel: 'scans.failed' },
      base,
    );

    expect(resolved).toMatchObject({
      timeout: { ms: 60_000, strategy: 'fixed' },
      maxSequenceBytes: 50 * MiB,
      prefetch: 2,
      deadLetterChannel: 'scans.failed',
    });
  });

  it("refuses a maxSequenceBytes above the module's maxBufferedBytes, naming the handler", () => {
    let error: unknown;
    try {
      resolveConsumerOptions('sequence consumer of scans', { maxSequenceBytes: 200 * MiB }, base);
    } catch (caught) {
      error = caught;
    }

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).where).toBe('sequence consumer of scans');
    expect((error as SequenceOptionsError).problems).toEqual([
      `maxSequenceBytes (${200 * MiB}) exceeds the module's maxBufferedBytes (${100 * MiB}); ` +
        'raise maxBufferedBytes or lower maxSequenceBytes',
    ]);
  });
});
