import { Registry } from 'prom-client';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { DEFAULTS } from './defaults';
import type { SequenceModuleOptions } from './module-options';
import type { ResolvedOptions } from './resolved-options';
import { resolveModuleOptions } from './resolve-options';
import { resolveSequenceConsumer } from './resolve-sequence';

const KiB = 1024;
const MiB = 1024 * KiB;

/** The module's options resolved; throws SequenceOptionsError as the module does. */
function resolve(
  options: SequenceModuleOptions,
  transport = new InMemoryTransport(),
): ResolvedOptions {
  const problems: string[] = [];
  const resolved = resolveModuleOptions(problems, options, transport);
  if (problems.length > 0) throw new SequenceOptionsError('SequenceModule options', problems);
  return resolved;
}

/** The problems reported for `options`, or [] when they are accepted. */
function problemsOf(options: SequenceModuleOptions, transport = new InMemoryTransport()): string[] {
  const problems: string[] = [];
  resolveModuleOptions(problems, options, transport);
  return problems;
}

/** Lets a test pass a value of the wrong type, as a config file or the environment would. */
const untyped = <T>(value: unknown): T => value as T;

describe('resolveModuleOptions', () => {
  describe('defaults', () => {
    it('applies every documented default', () => {
      const resolved = resolve({});

      expect(resolved).toMatchObject({
        publish: {
          confirmTimeoutMs: 10_000,
          inFlight: 2,
          retry: { attempts: 5, baseDelayMs: 100, maxDelayMs: 5_000 },
        },
        handlerRetry: { attempts: 3, baseDelayMs: 200, maxDelayMs: 30_000 },
        prefetch: 16,
        shutdownTimeoutMs: 10_000,
        metrics: { prefix: 'nest_sequence_' },
        sequence: {
          fragmentBytes: 16 * MiB - 16 * KiB,
          maxBufferedBytes: 1024 * MiB,
          maxOpenSequences: 10_000,
          retentionMs: 3_600_000,
          consumer: {
            timeout: { ms: 300_000, strategy: 'fixed' },
            maxSequenceBytes: 512 * MiB,
            maxFragments: 100_000,
            maxFragmentBytes: 16 * MiB,
            prefetch: 16,
            prefetchBytes: 32 * MiB,
          },
        },
        claimCheck: {
          inlineMaxBytes: 256 * KiB,
          sequenceMaxBytes: 64 * MiB,
          ttlMs: 86_400_000,
          expiredGraceMs: 300_000,
          orphanGraceMs: 3_600_000,
          deleteAfter: 'ack',
          ephemeralKeys: true,
          readTimeoutMs: 30_000,
          writeTimeoutMs: 300_000,
        },
        resequencer: {
          maxBufferedPerKey: 1_000,
          maxBufferedTotal: 100_000,
          maxBufferedBytesPerKey: 16 * MiB,
          maxBufferedBytesTotal: 256 * MiB,
          overflow: 'backpressure',
        },
        outbox: { configured: false, migrate: true },
        tuning: {
          headerAllowanceBytes: 16 * KiB,
          backpressureDelayMs: 500,
          leaseMs: 30_000,
          maxStoreRequeues: 1_200,
          drain: { batchSize: 32, waitMs: 2_000 },
          sweepers: {
            expiry: { intervalMs: 1_000, batchSize: 100 },
            orphans: { intervalMs: 60_000, batchSize: 500 },
            gaps: { intervalMs: 1_000, batchSize: 100 },
            purge: { intervalMs: 60_000, batchSize: 500 },
          },
        },
      });
      expect(resolved.sequence.consumer.deadLetterChannel).toBeUndefined();
      expect(resolved.sequence.onExpired).toBeUndefined();
    });

    it('takes its defaults from DEFAULTS, their one home', () => {
      const resolved = resolve({});

      expect(resolved.publish).toEqual(DEFAULTS.publish);
      expect(resolved.handlerRetry).toEqual(DEFAULTS.handlerRetry);
      expect(resolved.tuning.sweepers).toEqual(DEFAULTS.tuning.sweepers);
      expect(resolved.tuning.drain).toEqual(DEFAULTS.tuning.drain);
    });

    it('derives fragmentBytes, maxFragmentBytes and the inline limit from the transport', () => {
      const transport = new InMemoryTransport({ maxMessageBytes: 100_000 });

      const resolved = resolve({ tuning: { headerAllowanceBytes: 1_000 } }, transport);

      expect(resolved.sequence.fragmentBytes).toBe(99_000);
      expect(resolved.sequence.consumer.maxFragmentBytes).toBe(100_000);
      // The 256 KiB default would not fit in one message: it shrinks to what does.
      expect(resolved.claimCheck.inlineMaxBytes).toBe(99_000);
    });

    it('names this instance <hostname>-<pid>-<random> unless told', () => {
      const first = resolve({}).consumerId;
      const second = resolve({}).consumerId;

      expect(first).toContain(`-${process.pid}-`);
      expect(first).not.toBe(second);
      expect(resolve({ consumerId: 'pod-7' }).consumerId).toBe('pod-7');
    });

    it('takes retentionMs 0 on an outbox: its relay deletes what it published', () => {
      const { boxes } = resolve({ outbox: { outboxEvents: { retentionMs: 0 } } }).outbox;
      expect(boxes.outbox_events.retentionMs).toBe(0);
      expect(boxes.outbox_commands.retentionMs).toBe(DEFAULTS.outbox.retentionMs);
    });

    it('configures the outbox as soon as it is given, even empty', () => {
      expect(resolve({ outbox: {} }).outbox.configured).toBe(true);
    });
  });

  describe('overrides', () => {
    it('merges a partial publish policy with the defaults', () => {
      const resolved = resolve({ publish: { retry: { attempts: 9 }, inFlight: 4 } });

      expect(resolved.publish).toEqual({
        ...DEFAULTS.publish,
        inFlight: 4,
        retry: { ...DEFAULTS.publish.retry, attempts: 9 },
      });
    });

    it('treats undefined fields as absent, so they keep their defaults', () => {
      const resolved = resolve({
        sequence: { fragmentBytes: undefined, timeoutMs: undefined, timeoutStrategy: 'sliding' },
        publish: { retry: { attempts: undefined }, confirmTimeoutMs: 50 },
        handlerRetry: { attempts: undefined },
        tuning: { sweepers: { expiry: { intervalMs: undefined } } },
      });

      expect(resolved.sequence.fragmentBytes).toBe(16 * MiB - 16 * KiB);
      expect(resolved.publish).toEqual({ ...DEFAULTS.publish, confirmTimeoutMs: 50 });
      expect(resolved.sequence.consumer.timeout).toEqual({ ms: 300_000, strategy: 'sliding' });
      expect(resolved.handlerRetry).toEqual(DEFAULTS.handlerRetry);
      expect(resolved.tuning.sweepers.expiry).toEqual(DEFAULTS.tuning.sweepers.expiry);
    });

    it('keeps the values it is given', () => {
      const registry = new Registry();
      const onExpired = (): void => undefined;

      const resolved = resolve({
        sequence: {
          fragmentBytes: 4_096,
          maxSequenceBytes: 10 * MiB,
          maxBufferedBytes: 20 * MiB,
          deadLetterChannel: 'graveyard',
          onExpired,
        },
        tuning: { sweepers: { expiry: { intervalMs: false } } },
        metrics: { registry, prefix: 'imaging_' },
      });

      expect(resolved).toMatchObject({
        sequence: {
          fragmentBytes: 4_096,
          maxBufferedBytes: 20 * MiB,
          onExpired,
          consumer: { maxSequenceBytes: 10 * MiB, deadLetterChannel: 'graveyard' },
        },
        tuning: { sweepers: { expiry: { intervalMs: false } } },
        metrics: { registry, prefix: 'imaging_' },
      });
    });

    it('turns metrics off with metrics: false', () => {
      expect(resolve({ metrics: false }).metrics).toBe(false);
    });

    it('gives every box a retry policy, and an ordered inbox a prefetch of 1', () => {
      const { boxes } = resolve({
        outbox: {
          outboxEvents: { retry: { attempts: 2 } },
          inboxEvents: { ordered: true, prefetch: 64 },
          inboxCommands: { prefetch: 8 },
        },
      }).outbox;

      expect(boxes.outbox_events.retry).toEqual({ ...DEFAULTS.outbox.retry, attempts: 2 });
      expect(boxes.outbox_commands.retry).toEqual(DEFAULTS.outbox.retry);
      expect(boxes.inbox_events.prefetch).toBe(1);
      expect(boxes.inbox_commands.prefetch).toBe(8);
    });

    it('routes events to events.<type> and commands to commands.<targetService> by default', () => {
      const { routeEvent, routeCommand } = resolve({ outbox: {} }).outbox;
      expect(routeEvent({ type: 'OrderPlaced' } as never)).toEqual(['events.OrderPlaced']);
      expect(routeCommand({ targetService: 'billing' } as never)).toBe('commands.billing');
      const fanOut = resolve({ outbox: { routes: { event: () => ['a', 'b'] } } }).outbox;
      expect(fanOut.routeEvent({} as never)).toEqual(['a', 'b']);
    });
  });

  describe('unknown and renamed options', () => {
    it('refuses every old name with what replaced it, instead of keeping its default', () => {
      const old = untyped<SequenceModuleOptions>({
        fragmentBytes: 4 * MiB,
        timeout: { ms: 60_000 },
        sweepIntervalMs: false,
        publish: { attempts: 9 },
        claimCheck: { threshold: 1024, sweepBatch: 10 },
        resequencer: { drainBatch: 8 },
        outbox: { publishTimeoutMs: 5_000, outboxEvents: { retryBaseMs: 10 } },
      });

      expect(problemsOf(old)).toEqual([
        'fragmentBytes is no longer an option: use `sequence.fragmentBytes`',
        'timeout is no longer an option: use `sequence.timeoutMs` and `sequence.timeoutStrategy`',
        'sweepIntervalMs is no longer an option: use `tuning.sweepers.expiry.intervalMs`',
        'publish.attempts is no longer an option: use `publish.retry.attempts`',
        'claimCheck.threshold is no longer an option: use `claimCheck.inlineMaxBytes`',
        'claimCheck.sweepBatch is no longer an option: use `tuning.sweepers.orphans.batchSize`',
        'resequencer.drainBatch is no longer an option: use `tuning.drain.batchSize`',
        'outbox.publishTimeoutMs is no longer an option: use `publish.confirmTimeoutMs`',
        'outbox.outboxEvents.retryBaseMs is no longer an option: use ' +
          '`outbox.outboxEvents.retry.baseDelayMs`',
      ]);
    });

    it('refuses a misspelt option, listing those of its object', () => {
      expect(problemsOf(untyped({ tuning: { sweepers: { expiry: { interval: 5 } } } }))).toEqual([
        'tuning.sweepers.expiry.interval is not an option; tuning.sweepers.expiry takes ' +
          'intervalMs, batchSize',
      ]);
    });
  });

  describe('tracing', () => {
    it("links by default, with at most 32 links a span; false turns the module's spans off", () => {
      expect(resolve({}).tracing).toEqual({ enabled: true, parent: 'link', maxLinks: 32 });
      expect(resolve({ tracing: { parent: 'child', maxLinks: 4 } }).tracing).toEqual({
        enabled: true,
        parent: 'child',
        maxLinks: 4,
      });
      expect(resolve({ tracing: false }).tracing.enabled).toBe(false);
    });

    it('refuses an unknown parent mode, a negative maxLinks and unknown keys', () => {
      expect(
        problemsOf({ tracing: { parent: 'sibling', maxLinks: -1, sampled: true } as never }),
      ).toEqual([
        expect.stringContaining('tracing.sampled'),
        `tracing.parent must be 'link' or 'child', got "sibling"`,
        'tracing.maxLinks must be an integer >= 0, got -1',
      ]);
    });
  });

  describe('validation', () => {
    it("refuses a confirmTimeoutMs above the transport's maxPublishTimeoutMs, and takes it at it", () => {
      // As NATS JetStream with a 30 s duplicate window declares.
      const transport = Object.assign(new InMemoryTransport(), { maxPublishTimeoutMs: 29_999 });
      expect(problemsOf({ publish: { confirmTimeoutMs: 30_000 } }, transport)).toEqual([
        'publish.confirmTimeoutMs (30000) must be at most 29999 on the in-memory transport: a ' +
          'publish retried for longer could be stored twice, so every one would be refused',
      ]);
      expect(problemsOf({ publish: { confirmTimeoutMs: 29_999 } }, transport)).toEqual([]);
      expect(problemsOf({ publish: { confirmTimeoutMs: 60_000 } })).toEqual([]);
    });

    it.each<[string, unknown, string]>([
      ['NaN', NaN, 'NaN'],
      ['0', 0, '0'],
      ['negative', -1, '-1'],
      ['fractional', 29_999.5, '29999.5'],
      ['a string', '29999', 'a string'],
    ])("refuses a transport's maxPublishTimeoutMs that is %s", (_, maxPublishTimeoutMs, got) => {
      // NaN compares false: every confirmTimeoutMs would pass, so none would be held to a limit.
      const transport = Object.assign(new InMemoryTransport(), { maxPublishTimeoutMs });
      expect(problemsOf({}, transport)).toEqual([
        `the in-memory transport's maxPublishTimeoutMs must be a positive integer, got ${got}`,
      ]);
    });

    it.each<[string, unknown, string]>([
      ['NaN', NaN, 'NaN'],
      ['0', 0, '0'],
      ['negative', -1, '-1'],
      ['fractional', 65_536.5, '65536.5'],
      ['infinite', Infinity, 'Infinity'],
      ['a string', '65536', 'a string'],
    ])("refuses a transport's maxMessageBytes that is %s, once", (_, maxMessageBytes, got) => {
      const transport = Object.assign(new InMemoryTransport(), { maxMessageBytes });
      expect(problemsOf({}, transport)).toEqual([
        `the in-memory transport's maxMessageBytes must be a positive integer, got ${got}`,
      ]);
    });

    it("refuses a transport's unusable maxMessageBytes even when every size derived from it is given", () => {
      const sizes = {
        sequence: { fragmentBytes: 1_000, maxFragmentBytes: 2_000 },
        claimCheck: { inlineMaxBytes: 1_000 },
      };
      for (const maxMessageBytes of [NaN, Infinity]) {
        const transport = Object.assign(new InMemoryTransport(), { maxMessageBytes });
        expect(problemsOf(sizes, transport)).toEqual([
          `the in-memory transport's maxMessageBytes must be a positive integer, got ${maxMessageBytes}`,
        ]);
        // Nor compared with a fragmentBytes that would have been derived from it.
        expect(problemsOf({ sequence: { maxFragmentBytes: 2_000 } }, transport)).toEqual([
          `the in-memory transport's maxMessageBytes must be a positive integer, got ${maxMessageBytes}`,
        ]);
      }
    });

    it("refuses a transport's maxMessageBytes with no room for a fragment's body", () => {
      const at = (maxMessageBytes: number) =>
        Object.assign(new InMemoryTransport(), { maxMessageBytes });
      expect(problemsOf({}, at(16 * KiB))).toEqual([
        "the in-memory transport's maxMessageBytes (16384) must be above " +
          "tuning.headerAllowanceBytes (16384), the room kept for a fragment's headers",
      ]);
      expect(problemsOf({ sequence: { fragmentBytes: 1 } }, at(16 * KiB + 1))).toEqual([]);
      expect(problemsOf({ tuning: { headerAllowanceBytes: 0 } }, at(1))).toEqual([]);
    });

    it.each<[string, SequenceModuleOptions, string]>([
      [
        'a fragmentBytes that does not fit the transport',
        { sequence: { fragmentBytes: 16 * MiB } },
        `sequence.fragmentBytes (${16 * MiB}) plus tuning.headerAllowanceBytes (16384) exceeds ` +
          `the in-memory transport's maxMessageBytes (${16 * MiB}); set sequence.fragmentBytes ` +
          'to at most 16760832',
      ],
      [
        'fragmentBytes 0',
        { sequence: { fragmentBytes: 0 } },
        'sequence.fragmentBytes must be an integer >= 1, got 0',
      ],
      [
        'a claimCheck.writeTimeoutMs of 0',
        { claimCheck: { writeTimeoutMs: 0 } },
        'claimCheck.writeTimeoutMs must be an integer >= 1, got 0',
      ],
      [
        "a claimCheck.writeTimeoutMs past a Node timer's longest",
        { claimCheck: { writeTimeoutMs: 2 ** 31 } },
        "claimCheck.writeTimeoutMs must be at most 2147483647 (a Node timer's longest), got 2147483648",
      ],
      [
        'a metrics.prefix Prometheus would refuse',
        { metrics: { prefix: 'imaging-' } },
        'metrics.prefix must be empty or a Prometheus metric name (letters, digits, _ and :, ' +
          'not starting with a digit), got "imaging-"',
      ],
      [
        'a metrics.registry that is not a prom-client Registry',
        { metrics: { registry: untyped({ name: 'default' }) } },
        'metrics.registry must be a prom-client Registry (registerMetric, getSingleMetric, ' +
          'removeSingleMetric, metrics), got an object without them',
      ],
      [
        'a metrics.registry given as a name',
        { metrics: { registry: untyped('default') } },
        'metrics.registry must be a prom-client Registry (registerMetric, getSingleMetric, ' +
          'removeSingleMetric, metrics), got a string',
      ],
      [
        'a fractional fragmentBytes',
        { sequence: { fragmentBytes: 1.5 } },
        'sequence.fragmentBytes must be an integer >= 1, got 1.5',
      ],
      [
        'a negative headerAllowanceBytes',
        { tuning: { headerAllowanceBytes: -1 } },
        'tuning.headerAllowanceBytes must be an integer >= 0, got -1',
      ],
      [
        'publish.confirmTimeoutMs 0',
        { publish: { confirmTimeoutMs: 0 } },
        'publish.confirmTimeoutMs must be an integer >= 1, got 0',
      ],
      [
        'publish.retry.attempts 0',
        { publish: { retry: { attempts: 0 } } },
        'publish.retry.attempts must be an integer >= 1, got 0',
      ],
      [
        'a negative publish.retry.baseDelayMs',
        { publish: { retry: { baseDelayMs: -1 } } },
        'publish.retry.baseDelayMs must be an integer >= 0, got -1',
      ],
      [
        'a negative publish.retry.maxDelayMs',
        { publish: { retry: { maxDelayMs: -1 } } },
        'publish.retry.maxDelayMs must be an integer >= 0, got -1',
      ],
      [
        'a publish.retry.maxDelayMs below its baseDelayMs',
        { publish: { retry: { baseDelayMs: 200, maxDelayMs: 100 } } },
        'publish.retry.maxDelayMs (100) is below baseDelayMs (200); raise maxDelayMs or lower ' +
          'baseDelayMs',
      ],
      [
        'publish.inFlight 0',
        { publish: { inFlight: 0 } },
        'publish.inFlight must be an integer >= 1, got 0',
      ],
      [
        'sequence.timeoutMs 0',
        { sequence: { timeoutMs: 0 } },
        'sequence.timeoutMs must be an integer >= 1, got 0',
      ],
      [
        'an unknown sequence.timeoutStrategy',
        { sequence: { timeoutStrategy: untyped('lazy') } },
        `sequence.timeoutStrategy must be 'fixed' or 'sliding', got "lazy"`,
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
        { sequence: { maxSequenceBytes: 0 } },
        'sequence.maxSequenceBytes must be an integer >= 1, got 0',
      ],
      [
        'maxFragments 0',
        { sequence: { maxFragments: 0 } },
        'sequence.maxFragments must be an integer >= 1, got 0',
      ],
      [
        'maxFragmentBytes 0',
        { sequence: { maxFragmentBytes: 0 } },
        'sequence.maxFragmentBytes must be an integer >= 1, got 0',
      ],
      ['prefetch 0', { prefetch: 0 }, 'prefetch must be an integer >= 1, got 0'],
      [
        'prefetchBytes 0',
        { sequence: { prefetchBytes: 0 } },
        'sequence.prefetchBytes must be an integer >= 1, got 0',
      ],
      [
        'a prefetch above what RabbitMQ takes',
        { prefetch: 65_536 },
        'prefetch must be at most 65535, got 65536',
      ],
      [
        'an empty deadLetterChannel',
        { sequence: { deadLetterChannel: '' } },
        'sequence.deadLetterChannel must not be empty',
      ],
      [
        'a deadLetterChannel that is not a string',
        { sequence: { deadLetterChannel: 5 as never } },
        'sequence.deadLetterChannel must be a channel name, got a number',
      ],
      [
        'maxBufferedBytes 0',
        { sequence: { maxBufferedBytes: 0 } },
        'sequence.maxBufferedBytes must be an integer >= 1, got 0',
      ],
      [
        'maxOpenSequences 0',
        { sequence: { maxOpenSequences: 0 } },
        'sequence.maxOpenSequences must be an integer >= 1, got 0',
      ],
      [
        'a negative backpressureDelayMs',
        { tuning: { backpressureDelayMs: -1 } },
        'tuning.backpressureDelayMs must be an integer >= 1, got -1',
      ],
      [
        // Back at once, a message would skip the requeue count (and maxStoreRequeues) and, with
        // a prefetch of 1, come straight back ahead of the one that would unblock it.
        'backpressureDelayMs 0',
        { tuning: { backpressureDelayMs: 0 } },
        'tuning.backpressureDelayMs must be an integer >= 1, got 0',
      ],
      [
        'leaseMs below 100',
        { tuning: { leaseMs: 99 } },
        'tuning.leaseMs must be an integer >= 100, got 99',
      ],
      [
        'storeTimeoutMs 0',
        { tuning: { storeTimeoutMs: 0 } },
        'tuning.storeTimeoutMs must be an integer >= 1, got 0',
      ],
      [
        'retentionMs 0',
        { sequence: { retentionMs: 0 } },
        'sequence.retentionMs must be an integer >= 1, got 0',
      ],
      [
        'a sweeper intervalMs of 0',
        { tuning: { sweepers: { expiry: { intervalMs: 0 } } } },
        'tuning.sweepers.expiry.intervalMs must be above 0 (or false to turn it off on this instance)',
      ],
      // Past 2^31 - 1 ms Node fires a timer after 1 ms: the sweep would spin.
      [
        'a sweeper intervalMs no timer can wait',
        { tuning: { sweepers: { gaps: { intervalMs: 2 ** 31 } } } },
        'tuning.sweepers.gaps.intervalMs must be at most 2147483647 ms (the longest a timer ' +
          'waits), got 2147483648',
      ],
      [
        'a sweeper batchSize of 0',
        { tuning: { sweepers: { orphans: { batchSize: 0 } } } },
        'tuning.sweepers.orphans.batchSize must be an integer >= 1, got 0',
      ],
      [
        'a confirm timeout no timer can wait',
        { publish: { confirmTimeoutMs: 2 ** 32 } },
        'publish.confirmTimeoutMs must be at most 2147483647 ms (the longest a timer waits), ' +
          'got 4294967296',
      ],
      [
        'a maxSequenceBytes above maxBufferedBytes',
        { sequence: { maxSequenceBytes: 2_000, maxBufferedBytes: 1_000 } },
        'sequence.maxSequenceBytes (2000) exceeds sequence.maxBufferedBytes (1000): such a ' +
          'sequence could never be buffered whole; raise maxBufferedBytes or lower maxSequenceBytes',
      ],
      [
        'an onExpired that is not a function',
        { sequence: { onExpired: untyped('log it') } },
        'sequence.onExpired must be a function',
      ],
      [
        'a consumerId that is a number (a pid)',
        { consumerId: untyped(4242) },
        'consumerId must be 1-128 characters of [A-Za-z0-9._:-], got the number 4242',
      ],
      [
        'an outbox.serviceName that is a number',
        { outbox: { serviceName: untyped(7) } },
        'outbox.serviceName must be 1-100 letters, digits, _ . - (it names a channel), got the ' +
          'number 7',
      ],
      [
        'a metrics.prefix that is not a string',
        { metrics: { prefix: untyped(true) } },
        'metrics.prefix must be empty or a Prometheus metric name (letters, digits, _ and :, ' +
          'not starting with a digit), got true',
      ],
      [
        'a consumerId with forbidden characters',
        { consumerId: 'pod 7' },
        'consumerId must be 1-128 characters of [A-Za-z0-9._:-]',
      ],
      [
        'a resequencer overflow policy it does not know',
        { resequencer: { overflow: untyped('drop') } },
        `resequencer.overflow must be 'backpressure' or 'dead-letter', got "drop"`,
      ],
      [
        'a drain batch of 0',
        { tuning: { drain: { batchSize: 0 } } },
        'tuning.drain.batchSize must be an integer >= 1, got 0',
      ],
      [
        'an outbox service name that cannot name a channel',
        { outbox: { serviceName: 'has space' } },
        'outbox.serviceName must be 1-100 letters, digits, _ . - (it names a channel)',
      ],
      [
        'a box retry whose ceiling is below its base',
        { outbox: { outboxEvents: { retry: { baseDelayMs: 100, maxDelayMs: 10 } } } },
        'outbox.outboxEvents.retry.maxDelayMs (10) is below baseDelayMs (100); raise maxDelayMs ' +
          'or lower baseDelayMs',
      ],
      [
        'retentionMs 0 on an inbox, whose completed ids recognise duplicates',
        { outbox: { inboxEvents: { retentionMs: 0 } } },
        "outbox.inboxEvents.retentionMs must be at least 1: an inbox's completed records are " +
          'the ids that recognise duplicates, so keep them longer than a duplicate can take to ' +
          'arrive',
      ],
      [
        'a negative retentionMs on an outbox',
        { outbox: { outboxCommands: { retentionMs: -1 } } },
        'outbox.outboxCommands.retentionMs must be an integer >= 0, got -1',
      ],
      [
        'a prefetch on an outbox, which consumes nothing',
        { outbox: { outboxEvents: { prefetch: 4 } } },
        "outbox.outboxEvents.prefetch is for inboxes (an outbox's relay consumes nothing)",
      ],
    ])('refuses %s', (_, options, problem) => {
      expect(problemsOf(options)).toContain(problem);
    });

    it('refuses an option given as null once, rather than take its default', () => {
      // An empty key in a YAML file gives null.
      expect(
        problemsOf(
          untyped({
            prefetch: null,
            sequence: { timeoutStrategy: null },
            handlerRetry: { attempts: null },
          }),
        ),
      ).toEqual([
        'prefetch is null: give a value, or leave the key out for its default',
        'sequence.timeoutStrategy is null: give a value, or leave the key out for its default',
        'handlerRetry.attempts is null: give a value, or leave the key out for its default',
      ]);
    });

    it("refuses a handler's option given as null once, rather than take the module's", () => {
      expect(() =>
        resolveSequenceConsumer(
          '@SequencedHandler on Intake.analyse',
          untyped({ prefetch: null, deadLetterChannel: null }),
          resolve({}),
        ),
      ).toThrow(
        new SequenceOptionsError('@SequencedHandler on Intake.analyse', [
          'prefetch is null: give a value, or leave the key out for its default',
          'deadLetterChannel is null: give a value, or leave the key out for its default',
        ]),
      );
    });

    it('refuses a number given as a string, as the environment would supply it', () => {
      const problems = problemsOf({ sequence: { fragmentBytes: untyped('4096') } });

      expect(problems).toHaveLength(1);
      expect(problems[0]).toBe(
        'sequence.fragmentBytes must be an integer >= 1, got the string "4096" (convert values ' +
          'read from the environment with Number())',
      );
    });

    it.each([
      [0, 'handlerTimeoutMs must be an integer >= 1, got 0'],
      [1.5, 'handlerTimeoutMs must be an integer >= 1, got 1.5'],
      [Infinity, 'handlerTimeoutMs must be an integer >= 1, got Infinity'],
      [
        2 ** 31,
        `handlerTimeoutMs must be at most ${2 ** 31 - 1} ms (the longest a timer waits), got ${2 ** 31}`,
      ],
    ])('refuses handlerTimeoutMs %p, once', (value, problem) => {
      expect(problemsOf({ handlerTimeoutMs: value })).toEqual([problem]);
    });

    it("reports a bad module handlerRetry once, not again as each pattern's", () => {
      expect(problemsOf({ handlerRetry: { baseDelayMs: 50_000 } })).toEqual([
        'handlerRetry.maxDelayMs (30000) is below baseDelayMs (50000); raise maxDelayMs or ' +
          'lower baseDelayMs',
      ]);
    });

    it('reports every problem at once, in one SequenceOptionsError', () => {
      let error: unknown;
      try {
        resolve({
          prefetch: 0,
          tuning: { leaseMs: 1 },
          sequence: { timeoutStrategy: untyped('never') },
        });
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

    it('accepts the defaults, and sweepers turned off on this instance', () => {
      expect(problemsOf({})).toEqual([]);
      expect(
        problemsOf({
          tuning: {
            sweepers: {
              expiry: { intervalMs: false },
              orphans: { intervalMs: false },
              gaps: { intervalMs: false },
              purge: { intervalMs: false },
            },
          },
        }),
      ).toEqual([]);
    });
  });
});

describe('resolveSequenceConsumer', () => {
  const base = resolve({
    sequence: { maxBufferedBytes: 100 * MiB, maxSequenceBytes: 50 * MiB },
    prefetch: 8,
  });

  it("applies a handler's overrides on top of the module's options", () => {
    const resolved = resolveSequenceConsumer(
      'sequence consumer of scans',
      { timeoutMs: 60_000, prefetch: 2, deadLetterChannel: 'scans.failed' },
      base,
    );

    expect(resolved).toMatchObject({
      timeout: { ms: 60_000, strategy: 'fixed' },
      maxSequenceBytes: 50 * MiB,
      prefetch: 2,
      deadLetterChannel: 'scans.failed',
    });
  });

  it("takes the module's handlerTimeoutMs unless the handler sets its own, or false for none", () => {
    const limited = resolve({ handlerTimeoutMs: 5_000 });

    expect(limited.handlerTimeoutMs).toBe(5_000);
    expect(resolve({}).handlerTimeoutMs).toBeUndefined();
    expect(resolveSequenceConsumer('c', {}, limited).handlerTimeoutMs).toBe(5_000);
    expect(resolveSequenceConsumer('c', { handlerTimeoutMs: 50 }, limited).handlerTimeoutMs).toBe(
      50,
    );
    expect(
      resolveSequenceConsumer('c', { handlerTimeoutMs: false }, limited).handlerTimeoutMs,
    ).toBeUndefined();
  });

  it('refuses a handlerTimeoutMs that is not a positive integer, naming the handler', () => {
    let error: unknown;
    try {
      resolveSequenceConsumer('sequence consumer of scans', { handlerTimeoutMs: -1 }, base);
    } catch (caught) {
      error = caught;
    }

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(error).toMatchObject({
      where: 'sequence consumer of scans',
      problems: ['handlerTimeoutMs must be an integer >= 1, got -1'],
    });
  });

  it('refuses an option a consumer does not have, naming the handler', () => {
    let error: unknown;
    try {
      resolveSequenceConsumer(
        'sequence consumer of scans',
        untyped({ timeout: { ms: 5_000 }, prefetchBytez: 1 }),
        base,
      );
    } catch (caught) {
      error = caught;
    }

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(error).toMatchObject({
      where: 'sequence consumer of scans',
      problems: [
        'timeout is no longer an option: use `timeoutMs` and `timeoutStrategy`',
        expect.stringMatching(/^prefetchBytez is not an option; the options are timeoutMs, /),
      ],
    });
  });

  it("refuses a maxSequenceBytes above the module's maxBufferedBytes, naming the handler", () => {
    let error: unknown;
    try {
      resolveSequenceConsumer('sequence consumer of scans', { maxSequenceBytes: 200 * MiB }, base);
    } catch (caught) {
      error = caught;
    }

    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).where).toBe('sequence consumer of scans');
    expect((error as SequenceOptionsError).problems).toEqual([
      `maxSequenceBytes (${200 * MiB}) exceeds the module's sequence.maxBufferedBytes ` +
        `(${100 * MiB}); raise maxBufferedBytes or lower maxSequenceBytes`,
    ]);
  });
});
