import {
  Controller,
  Inject,
  Injectable,
  Module,
  Scope,
  type INestApplicationContext,
  type LoggerService,
  type ModuleMetadata,
} from '@nestjs/common';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Test } from '@nestjs/testing';
import { Registry } from 'prom-client';
import {
  ClaimCheck,
  ClaimCheckService,
  FilesystemPayloadStore,
  InboxHandler,
  InMemoryTransport,
  type ClaimedPayload,
  type StreamedFragment,
  Resequenced,
  type ResequencedEvent,
  MemorySequenceStore,
  ReassembledPayload,
  SEQUENCE_METRICS_REGISTRY,
  SEQUENCE_TRANSPORT,
  SequenceModule,
  SequenceHandlerConflictError,
  SequenceOptionsError,
  SequencedHandler,
  SplitterService,
  type SequenceModuleOptions,
  type SequenceStore,
  type Subscription,
  type Transport,
} from 'nest-sequence';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER } from 'nest-sequence/wire';
import { RESOLVED_OPTIONS, SEQUENCE_STORE } from './kernel/tokens';
import { ChannelRegistry } from './kernel/channel.registry';
import type { ResolvedOptions } from './options/resolved-options';
import { type MessageHandler, type SubscribeOptions } from 'nest-sequence/ports';
import {
  ClosingDatabase,
  ClosingDatabaseModule,
  heldHandlerProbe,
} from '../test/support/closing-dependency';
import { ForwardingTransport } from './testing/forwarding.transport';
import {
  bytes,
  eventually,
  makeFragments,
  publishAll,
  recordingHandler,
  type RecordingHandler,
} from '../test/support/sequence-test-app';

const KiB = 1024;

const apps: INestApplicationContext[] = [];

/** Compiles and initialises an application (bootstrap included), silencing Nest's own logs. */
async function boot(
  metadata: ModuleMetadata,
  logger: LoggerService | false = false,
): Promise<INestApplicationContext> {
  const moduleRef = await Test.createTestingModule(metadata).compile();
  moduleRef.useLogger(logger);
  const app = await moduleRef.init();
  apps.push(app);
  return app;
}

/** The error a bootstrap fails with. */
async function bootError(metadata: ModuleMetadata, logger: LoggerService | false = false) {
  return boot(metadata, logger).then(
    () => {
      throw new Error('expected the bootstrap to fail');
    },
    (error: unknown) => error,
  );
}

afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

/** Sends `payload` with the app's splitter and waits for the recording handler to receive it. */
async function roundTrip(
  app: INestApplicationContext,
  Handler: new (...args: never[]) => RecordingHandler,
  channel: string,
  payload: Buffer,
) {
  const receipt = await app.get(SplitterService).send(channel, payload);
  const handler = app.get(Handler);
  await eventually(() => handler.of(receipt.sequenceId).length === 1, `delivery on ${channel}`);
  return { receipt, delivery: handler.of(receipt.sequenceId)[0] };
}

class CapturingLogger implements LoggerService {
  readonly warnings: string[] = [];
  log(): void {}
  error(): void {}
  warn(message: unknown): void {
    this.warnings.push(String(message));
  }
}

describe('SequenceModule', () => {
  describe('forRoot', () => {
    it('boots with no options and delivers a payload end to end', async () => {
      const Handler = recordingHandler({ channel: 'round-trip' });
      const app = await boot({ imports: [SequenceModule.forRoot()], providers: [Handler] });

      const payload = bytes(100 * KiB);
      const receipt = await app
        .get(SplitterService)
        .send('round-trip', payload, { fragmentBytes: 8 * KiB, headers: { tenant: 'acme' } });

      const handler = app.get(Handler);
      await eventually(() => handler.deliveries.length === 1, 'the delivery');
      const [delivery] = handler.deliveries;
      expect(delivery.bytes.equals(payload)).toBe(true);
      expect(delivery.payload).toMatchObject({
        channel: 'round-trip',
        sequenceId: receipt.sequenceId,
        fragments: 13,
        bytes: payload.length,
        sha256: receipt.sha256,
        headers: { tenant: 'acme' },
      });
    });

    it('defaults to an in-memory transport of 16 MiB messages and fragments that fit it', async () => {
      const app = await boot({ imports: [SequenceModule.forRoot()] });

      expect(app.get(SEQUENCE_TRANSPORT)).toBeInstanceOf(InMemoryTransport);
      expect(app.get<Transport>(SEQUENCE_TRANSPORT).maxMessageBytes).toBe(16 * 1024 * KiB);
      expect(app.get(SEQUENCE_STORE)).toBeInstanceOf(MemorySequenceStore);
      expect(app.get<ResolvedOptions>(RESOLVED_OPTIONS).sequence.fragmentBytes).toBe(16_760_832);
    });
  });

  describe('forRootAsync', () => {
    const SEQUENCE_CONFIG = Symbol('SEQUENCE_CONFIG');

    interface SequenceConfig {
      fragmentBytes: number;
    }

    @Module({
      providers: [{ provide: SEQUENCE_CONFIG, useValue: { fragmentBytes: 1_000 } }],
      exports: [SEQUENCE_CONFIG],
    })
    class SequenceConfigModule {}

    it('takes its options from an async useFactory with imports and inject', async () => {
      const Handler = recordingHandler({ channel: 'async-factory' });
      const factory = jest.fn(async (config: SequenceConfig): Promise<SequenceModuleOptions> => ({
        sequence: { fragmentBytes: config.fragmentBytes },
        tuning: { sweepers: { expiry: { intervalMs: false } } },
      }));
      const app = await boot({
        imports: [
          SequenceModule.forRootAsync({
            imports: [SequenceConfigModule],
            inject: [SEQUENCE_CONFIG],
            useFactory: factory,
          }),
        ],
        providers: [Handler],
      });

      const payload = bytes(2_500);
      const { receipt, delivery } = await roundTrip(app, Handler, 'async-factory', payload);

      expect(factory).toHaveBeenCalledWith({ fragmentBytes: 1_000 });
      expect(receipt.fragments).toBe(3);
      expect(delivery.bytes.equals(payload)).toBe(true);
    });

    it('takes its options from a useClass factory', async () => {
      class SequenceOptionsFromClass {
        createSequenceOptions(): SequenceModuleOptions {
          return {
            sequence: { fragmentBytes: 700 },
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          };
        }
      }
      const Handler = recordingHandler({ channel: 'use-class' });
      const app = await boot({
        imports: [SequenceModule.forRootAsync({ useClass: SequenceOptionsFromClass })],
        providers: [Handler],
      });

      const payload = bytes(2_500);
      const { receipt, delivery } = await roundTrip(app, Handler, 'use-class', payload);

      expect(receipt.fragments).toBe(4);
      expect(delivery.bytes.equals(payload)).toBe(true);
    });

    it('takes its options from an existing provider with useExisting', async () => {
      @Injectable()
      class SequenceSettings {
        constructor(@Inject(SEQUENCE_CONFIG) private readonly config: SequenceConfig) {}

        createSequenceOptions(): SequenceModuleOptions {
          return {
            sequence: { fragmentBytes: this.config.fragmentBytes / 2 },
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          };
        }
      }
      @Module({
        imports: [SequenceConfigModule],
        providers: [SequenceSettings],
        exports: [SequenceSettings],
      })
      class SettingsModule {}
      const Handler = recordingHandler({ channel: 'use-existing' });
      const app = await boot({
        imports: [
          SequenceModule.forRootAsync({ imports: [SettingsModule], useExisting: SequenceSettings }),
        ],
        providers: [Handler],
      });

      const payload = bytes(2_500);
      const { receipt, delivery } = await roundTrip(app, Handler, 'use-existing', payload);

      expect(receipt.fragments).toBe(5);
      expect(delivery.bytes.equals(payload)).toBe(true);
    });

    it('fails the bootstrap when the factory returns invalid options', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRootAsync({
            useFactory: () => ({ publish: { retry: { attempts: 0 } } }),
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        'publish.retry.attempts must be an integer >= 1, got 0',
      ]);
    });

    it.each([
      ['undefined (a factory that forgot its return)', undefined, /got undefined/],
      ['null', null, /got null/],
      ['a string', 'amqp://broker', /got "amqp:\/\/broker"/],
      ['an array', [{ prefetch: 4 }], /got an array/],
    ])(
      'fails the bootstrap when the factory returns %s rather than falling back to the defaults',
      async (_, returned, says) => {
        const error = await bootError({
          imports: [SequenceModule.forRootAsync({ useFactory: async () => returned as never })],
        });

        expect(error).toBeInstanceOf(SequenceOptionsError);
        expect((error as SequenceOptionsError).problems).toEqual([expect.stringMatching(says)]);
      },
    );
  });

  describe('isGlobal', () => {
    @Injectable()
    class Archive {
      constructor(readonly splitter: SplitterService) {}
    }

    @Module({ providers: [Archive], exports: [Archive] })
    class ArchiveModule {}

    it('makes SplitterService injectable in a module that does not import SequenceModule', async () => {
      const app = await boot({
        imports: [
          SequenceModule.forRoot({
            isGlobal: true,
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
          ArchiveModule,
        ],
      });

      const archive = app.get(Archive);
      expect(archive.splitter).toBe(app.get(SplitterService));
      await expect(archive.splitter.send('archive', bytes(10))).resolves.toMatchObject({
        fragments: 1,
        bytes: 10,
      });
    });

    it('works with forRootAsync too', async () => {
      const app = await boot({
        imports: [
          SequenceModule.forRootAsync({
            isGlobal: true,
            useFactory: () => ({
              tuning: { sweepers: { expiry: { intervalMs: false as const } } },
            }),
          }),
          ArchiveModule,
        ],
      });

      expect(app.get(Archive).splitter).toBe(app.get(SplitterService));
    });

    it('is off by default: a module that does not import SequenceModule cannot inject it', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
          ArchiveModule,
        ],
      });

      expect(String(error)).toMatch(/can't resolve dependencies of the Archive/);
      expect(String(error)).toContain('SplitterService');
    });
  });

  describe('option validation at bootstrap', () => {
    it('refuses a fragmentBytes too big for the transport, saying the largest that fits', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            transport: new InMemoryTransport({ maxMessageBytes: 64 * KiB }),
            sequence: { fragmentBytes: 60_000 },
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as Error).message).toContain(
        'sequence.fragmentBytes (60000) plus tuning.headerAllowanceBytes (16384) exceeds the ' +
          "in-memory transport's maxMessageBytes (65536); set sequence.fragmentBytes to at most 49152",
      );
    });

    it('refuses a maxSequenceBytes larger than maxBufferedBytes, saying which to change', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            sequence: { maxBufferedBytes: 1_000, maxSequenceBytes: 2_000 },
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as Error).message).toContain(
        'sequence.maxSequenceBytes (2000) exceeds sequence.maxBufferedBytes (1000)',
      );
      expect((error as Error).message).toContain(
        'raise maxBufferedBytes or lower maxSequenceBytes',
      );
    });

    it('refuses a timeoutStrategy other than fixed or sliding', async () => {
      const strategy = 'eventually' as 'fixed';
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            sequence: { timeoutMs: 1_000, timeoutStrategy: strategy },
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as Error).message).toContain(
        `sequence.timeoutStrategy must be 'fixed' or 'sliding', got "eventually"`,
      );
    });

    it("refuses a handler's invalid options, naming its channel", async () => {
      const Handler = recordingHandler({ channel: 'strict', timeoutMs: 0 });
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [Handler],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).where).toBe('sequence consumer of strict');
      expect((error as SequenceOptionsError).problems).toEqual([
        'timeoutMs must be an integer >= 1, got 0',
      ]);
    });
  });

  describe('unknown and renamed options', () => {
    /** Lets a test pass options TypeScript would refuse, as a config object or JavaScript does. */
    const untyped = <T>(value: unknown): T => value as T;

    it('refuses an adapter given as null once, by name', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRoot(
            untyped<SequenceModuleOptions>({ transport: null, sequence: { store: null } }),
          ),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        'transport is null: give a value, or leave the key out for its default',
        'sequence.store is null: give a value, or leave the key out for its default',
      ]);
    });

    it('refuses, from a forRootAsync factory, a store under its old name instead of ignoring it', async () => {
      const store = new MemorySequenceStore();
      const error = await bootError({
        imports: [
          SequenceModule.forRootAsync({
            // A factory's result is not a literal: TypeScript lets the extra key through.
            useFactory: async () => untyped<SequenceModuleOptions>({ prefetch: 8, store }),
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        'store is no longer an option: use `sequence.store` (or `stores`, e.g. redis(url) of ' +
          'nest-sequence/redis)',
      ]);
    });

    it.each<[string, () => unknown, string, string[]]>([
      [
        '@SequencedHandler',
        () => {
          @Injectable()
          class Handler {
            @SequencedHandler(untyped({ channel: 'a', timeout: { ms: 1_000 } }))
            async handle(): Promise<void> {}
          }
          return Handler;
        },
        '@SequencedHandler on Handler.handle',
        ['timeout is no longer an option: use `timeoutMs` and `timeoutStrategy`'],
      ],
      [
        '@ClaimCheck',
        () => {
          @Injectable()
          class Handler {
            @ClaimCheck(untyped({ channel: 'a', sequence: { timeout: { ms: 1_000 } } }))
            async handle(): Promise<void> {}
          }
          return Handler;
        },
        '@ClaimCheck on Handler.handle',
        [
          'sequence.timeout is no longer an option: use `sequence.timeoutMs` and ' +
            '`sequence.timeoutStrategy`',
        ],
      ],
      [
        '@Resequenced',
        () => {
          @Injectable()
          class Handler {
            @Resequenced(
              untyped({ channel: 'a', gap: { timeoutMs: 1_000, policy: 'alert', grace: 1 } }),
            )
            async handle(): Promise<void> {}
          }
          return Handler;
        },
        '@Resequenced on Handler.handle',
        ['gap.grace is not an option; gap takes timeoutMs, policy'],
      ],
      [
        '@InboxHandler',
        () => {
          @Injectable()
          class Handler {
            @InboxHandler(untyped({ event: 'TaskCreated', inTransaction: true }))
            async handle(): Promise<void> {}
          }
          return Handler;
        },
        '@InboxHandler on Handler.handle',
        [
          'inTransaction is not an option; the options are event, command, channel, ' +
            'processInTransaction, handlerTimeoutMs',
        ],
      ],
    ])(
      'refuses an unknown option of %s at boot, naming the method',
      async (_, define, where, problems) => {
        const error = await bootError({
          imports: [SequenceModule.forRoot()],
          providers: [define() as new () => unknown],
        });

        expect(error).toBeInstanceOf(SequenceOptionsError);
        expect(error).toMatchObject({ where, problems });
      },
    );

    it('refuses a store set given where one store goes, and an adapter without its methods', async () => {
      const set = {
        name: 'redis',
        sequenceStore: new MemorySequenceStore(),
        close: async () => {},
      };
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            resequencer: { store: untyped(set) },
            claimCheck: { ledger: untyped({ name: 'mine', claim: () => undefined }) },
          }),
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        'resequencer.store is given a store set (from a preset such as redis()); pass it as ' +
          '`stores` instead',
        'claimCheck.ledger must be a ClaimLedger (it has no complete, close); see ' +
          'nest-sequence/ports',
      ]);
    });

    it('refuses an outbox store that is not one with one problem, naming what it lacks', async () => {
      const error = await bootError({
        imports: [SequenceModule.forRoot({ outbox: { store: untyped({}) } })],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        'outbox.store must be an OutboxStore (it has no append, claim, close); see ' +
          'nest-sequence/ports',
      ]);
    });

    it('refuses old per-call options of send() and publish() before sending anything', async () => {
      const transport = new InMemoryTransport();
      const app = await boot({ imports: [SequenceModule.forRoot({ transport })] });

      await expect(
        app.get(SplitterService).send('calls', bytes(10), untyped({ publish: { attempts: 1 } })),
      ).rejects.toMatchObject({
        problems: ['publish.attempts is no longer an option: use `publish.retry.attempts`'],
      });
      await expect(
        app.get(ClaimCheckService).publish('calls', bytes(10), untyped({ threshold: 1 })),
      ).rejects.toMatchObject({
        problems: ['threshold is no longer an option: use `inlineMaxBytes`'],
      });
      expect(transport.depth('calls')).toBe(0);
    });
  });

  describe('metrics', () => {
    it("hands out the registry its metrics are in, the module's own by default", async () => {
      const Handler = recordingHandler({ channel: 'metered' });
      const app = await boot({ imports: [SequenceModule.forRoot()], providers: [Handler] });
      await roundTrip(app, Handler, 'metered', bytes(1_000));

      const registry = app.get<Registry>(SEQUENCE_METRICS_REGISTRY);
      expect(await registry.metrics()).toMatch(
        /^nest_sequence_sequences_completed_total\{channel="metered"\} 1$/m,
      );
    });

    it('hands out the registry given in options', async () => {
      const given = new Registry();
      const app = await boot({
        imports: [SequenceModule.forRoot({ metrics: { registry: given } })],
      });

      expect(app.get(SEQUENCE_METRICS_REGISTRY)).toBe(given);
    });
  });

  describe('secrets', () => {
    it('lets no other module look up its options, which hold the keys', async () => {
      const secret = Buffer.alloc(32, 9);
      const app = await boot({
        imports: [
          SequenceModule.forRoot({
            claimCheck: {
              store: new FilesystemPayloadStore({ root: '/nonexistent/never-used' }),
              signingKeys: [{ id: 'k1', secret }],
            },
          }),
        ],
      });

      for (const token of ['SEQUENCE_MODULE_OPTIONS', 'SEQUENCE_OPTIONS', 'CLAIM_CHECK_OPTIONS']) {
        expect(() => app.get<unknown>(token, { strict: false })).toThrow();
      }
    });
  });

  describe('shutdown', () => {
    it('closes every store set though one fails to close', async () => {
      const closed: string[] = [];
      const set = (name: string, fails: boolean) => ({
        name,
        close: async () => {
          closed.push(name);
          if (fails) throw new Error(`${name} would not close`);
        },
      });
      const logger = new CapturingLogger();
      const app = await boot(
        {
          imports: [SequenceModule.forRoot({ stores: [set('first', true), set('second', false)] })],
        },
        logger,
      );

      await app.close();
      apps.splice(apps.indexOf(app), 1);

      expect(closed).toEqual(['first', 'second']);
      expect(logger.warnings).toContainEqual(
        expect.stringContaining('closing the store set first failed: first would not close'),
      );
    });

    it('gives up on a store set whose close never settles after shutdownTimeoutMs (at least 1 s), and closes the next', async () => {
      const closed: string[] = [];
      const set = (name: string, hangs: boolean) => ({
        name,
        close: () => {
          closed.push(name);
          return hangs ? new Promise<void>(() => undefined) : Promise.resolve();
        },
      });
      const logger = new CapturingLogger();
      const app = await boot(
        {
          imports: [
            SequenceModule.forRoot({
              stores: [set('frozen', true), set('second', false)],
              shutdownTimeoutMs: 200,
            }),
          ],
        },
        logger,
      );
      const startedAt = Date.now();

      await app.close();
      apps.splice(apps.indexOf(app), 1);

      expect(closed).toEqual(['frozen', 'second']);
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(1_000);
      expect(logger.warnings).toContainEqual(
        expect.stringMatching(
          /closing the store set frozen did not finish within 1000 ms \(shutdownTimeoutMs, at least 1000\)/,
        ),
      );
    });
  });

  describe('closeTransport', () => {
    /** An in-memory transport that notes when it closes, in `closed`. */
    function noting(closed: string[]): InMemoryTransport {
      const transport = new InMemoryTransport();
      const close = transport.close.bind(transport);
      transport.close = async () => {
        closed.push('transport');
        await close();
      };
      return transport;
    }
    const set = (closed: string[]) => ({
      name: 'preset',
      close: async () => void closed.push('preset'),
    });
    /** A transport and a store set the module owns, each noting in `closed` when it closes. */
    const owned = (closed: string[]) => ({
      transport: noting(closed),
      closeTransport: true,
      stores: set(closed),
    });

    it('closes a given transport with the application, before the store sets', async () => {
      const closed: string[] = [];
      const transport = noting(closed);
      const app = await boot({
        imports: [SequenceModule.forRoot({ transport, closeTransport: true, stores: set(closed) })],
      });

      await app.close();
      apps.splice(apps.indexOf(app), 1);

      expect(closed).toEqual(['transport', 'preset']);
      await expect(transport.publish('after', Buffer.from('x'), {})).rejects.toThrow(
        'in-memory transport is closed',
      );
    });

    it('leaves a given transport open without it', async () => {
      const closed: string[] = [];
      const transport = noting(closed);
      const app = await boot({
        imports: [SequenceModule.forRoot({ transport, stores: set(closed) })],
      });

      await app.close();
      apps.splice(apps.indexOf(app), 1);

      expect(closed).toEqual(['preset']);
      await transport.publish('after', Buffer.from('x'), {});
      expect(transport.depth('after')).toBe(1);
      await transport.close();
    });

    it('closes what it owns when the options are refused', async () => {
      const closed: string[] = [];
      const error = await bootError({
        imports: [SequenceModule.forRoot({ ...owned(closed), prefetch: -1 })],
      });
      expect(error).toBeInstanceOf(SequenceOptionsError);
      // Nest runs no hook for an app that failed to build: the connections would stay open.
      expect(closed).toEqual(['transport', 'preset']);
    });

    it("closes what it owns, and takes its metrics out of the app's registry, when a handler is refused at init", async () => {
      @Injectable()
      class Refused {
        @SequencedHandler({ channel: 'refused', prefetch: -1 })
        async handle(_payload: ReassembledPayload): Promise<void> {}
      }
      const closed: string[] = [];
      const registry = new Registry();
      const error = await bootError({
        imports: [SequenceModule.forRoot({ ...owned(closed), metrics: { registry } })],
        providers: [Refused],
      });
      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect(closed).toEqual(['transport', 'preset']);

      // The next application in the process (a retried start) registers its metrics again.
      const next = await boot({
        imports: [SequenceModule.forRoot({ metrics: { registry } })],
      });
      expect(next.get(SEQUENCE_METRICS_REGISTRY)).toBe(registry);
    });

    it('closes what both instances own when the module is imported twice', async () => {
      const closed: string[] = [];
      @Module({
        imports: [SequenceModule.forRoot({ transport: noting(closed), closeTransport: true })],
      })
      class ImagingModule {}

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({ transport: noting(closed), closeTransport: true }),
          ImagingModule,
        ],
      });
      expect((error as Error).message).toContain('SequenceModule is imported 2 times');
      expect(closed).toEqual(['transport', 'transport']);
    });

    it('refuses a value that is not a boolean', async () => {
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            transport: new InMemoryTransport(),
            closeTransport: 'yes' as unknown as boolean,
          }),
        ],
      });
      expect((error as Error).message).toContain('closeTransport must be true or false, got "yes"');
    });
  });

  describe('stores that keep state in the process only', () => {
    /** The in-memory broker under another name: a broker that keeps messages, to the module. */
    class DurableBroker extends ForwardingTransport {
      readonly name = 'rabbitmq';
    }
    @Injectable()
    class StudyArchive {
      @SequencedHandler({ channel: 'studies' })
      async archive(_payload: ReassembledPayload): Promise<void> {}
    }

    /**
     * The process-memory warnings an app with `providers` logs at startup, on a broker that keeps
     * messages unless `options` say otherwise.
     */
    async function warningsOf(
      providers: Array<new (...args: never[]) => unknown>,
      options: SequenceModuleOptions = {},
    ): Promise<string[]> {
      const { logger } = await appOf(providers, options);
      return logger.warnings.filter((warning) => warning.includes('in memory only'));
    }

    /** An app with `providers` on a broker that keeps messages, and every warning it logged. */
    async function appOf(
      providers: Array<new (...args: never[]) => unknown>,
      options: SequenceModuleOptions = {},
    ): Promise<{ app: INestApplicationContext; logger: CapturingLogger }> {
      const logger = new CapturingLogger();
      const app = await boot(
        {
          imports: [
            SequenceModule.forRoot({
              transport: new DurableBroker(new InMemoryTransport()),
              claimCheck: {
                store: new FilesystemPayloadStore({ root: '/nonexistent/never-used' }),
              },
              ...options,
              tuning: {
                sweepers: {
                  orphans: { intervalMs: false },
                  gaps: { intervalMs: false },
                  expiry: { intervalMs: false },
                },
              },
            }),
          ],
          providers,
        },
        logger,
      );
      return { app, logger };
    }

    it('warns once at startup when a broker that keeps messages acks fragments into MemorySequenceStore', async () => {
      expect(await warningsOf([StudyArchive])).toEqual([
        expect.stringMatching(
          /^rabbitmq acks what this process keeps in memory only: sequence fragments \(the module's store defaults to MemorySequenceStore; .*A crash loses what was acked/,
        ),
      ]);
    });

    it('warns of MemoryResequencerStore under @Resequenced on such a broker', async () => {
      @Injectable()
      class StatusProjection {
        @Resequenced({ channel: 'statuses', gap: { timeoutMs: 60_000, policy: 'alert' } })
        async apply(_event: ResequencedEvent): Promise<void> {}
      }

      expect(await warningsOf([StatusProjection])).toEqual([
        expect.stringMatching(
          /in memory only: resequenced and streamed events \(`resequencer.store` defaults to MemoryResequencerStore/,
        ),
      ]);
    });

    it('names the store that applies: the resequencer store under stream mode, the sequence store under @ClaimCheck', async () => {
      @Injectable()
      class LiveViewer {
        @SequencedHandler({ channel: 'live', mode: 'stream' })
        async show(_fragment: StreamedFragment): Promise<void> {}
      }
      @Injectable()
      class Intake {
        @ClaimCheck({ channel: 'intake' })
        async take(_payload: ClaimedPayload): Promise<void> {}
      }

      // Stream mode is built on the resequencer: its store, not the sequence store.
      const streamed = await warningsOf([LiveViewer]);
      expect(streamed).toEqual([expect.not.stringContaining('MemorySequenceStore')]);
      expect(streamed[0]).toContain('MemoryResequencerStore');
      // A Claim Check channel reassembles payloads its producers send as a sequence.
      const claimChecked = await warningsOf([Intake]);
      expect(claimChecked).toEqual([expect.stringContaining('MemorySequenceStore')]);
      expect(claimChecked[0]).not.toContain('MemoryResequencerStore');
    });

    it('warns of MemoryClaimLedger under @ClaimCheck: its claims live in this process only', async () => {
      @Injectable()
      class Intake {
        @ClaimCheck({ channel: 'intake' })
        async take(_payload: ClaimedPayload): Promise<void> {}
      }

      const [warning] = await warningsOf([Intake]);
      expect(warning).toMatch(
        /claim-check claims \(`claimCheck.ledger` defaults to MemoryClaimLedger/,
      );
      expect(warning).toContain('sequence fragments');
    });

    it('warns at startup that signingKeys is unset when a @ClaimCheck handler receives tickets', async () => {
      @Injectable()
      class Intake {
        @ClaimCheck({ channel: 'intake' })
        async take(_payload: ClaimedPayload): Promise<void> {}
      }

      const { logger } = await appOf([Intake]);
      expect(logger.warnings.filter((w) => w.includes('signingKeys is not set'))).toEqual([
        expect.stringContaining('other processes on the rabbitmq transport will refuse them'),
      ]);
    });

    it('says nothing of claim checks in an app that uses none', async () => {
      const { logger } = await appOf([StudyArchive]);

      expect(logger.warnings.filter((w) => /claimCheck|ClaimLedger|ticket/.test(w))).toEqual([]);
    });

    it('warns of an unset signingKeys once, when a sender without handlers signs its first ticket', async () => {
      const root = mkdtempSync(join(tmpdir(), 'nseq-keys-'));
      try {
        const { app, logger } = await appOf([], {
          claimCheck: { store: new FilesystemPayloadStore({ root }) },
        });
        const keyWarnings = () =>
          logger.warnings.filter((w) => w.includes('signingKeys is not set'));
        expect(keyWarnings()).toEqual([]);

        const claimCheck = app.get(ClaimCheckService);
        await claimCheck.release(await claimCheck.checkIn(Buffer.from('first')));
        await claimCheck.release(await claimCheck.checkIn(Buffer.from('second')));

        expect(keyWarnings()).toHaveLength(1);
      } finally {
        rmSync(root, { recursive: true, force: true });
      }
    });

    it('says nothing of signing keys when they are set', async () => {
      @Injectable()
      class Intake {
        @ClaimCheck({ channel: 'intake' })
        async take(_payload: ClaimedPayload): Promise<void> {}
      }

      const { logger } = await appOf([Intake], {
        claimCheck: {
          store: new FilesystemPayloadStore({ root: '/nonexistent/never-used' }),
          signingKeys: [{ id: 'k1', secret: Buffer.alloc(32, 7) }],
        },
      });
      expect(logger.warnings.filter((w) => w.includes('signingKeys'))).toEqual([]);
    });

    it('says nothing on the in-memory transport, nor with a store of another kind', async () => {
      const store = new MemorySequenceStore();

      expect(await warningsOf([StudyArchive], { transport: new InMemoryTransport() })).toEqual([]);
      expect(
        await warningsOf([StudyArchive], {
          // Another kind of store, as the module sees it (a Redis store, say).
          sequence: {
            store: Object.assign(Object.create(store) as MemorySequenceStore, { name: 'redis' }),
          },
        }),
      ).toEqual([]);
    });
  });

  describe('handler discovery', () => {
    it('ignores a @SequencedHandler on a request-scoped provider and warns about it', async () => {
      @Injectable({ scope: Scope.REQUEST })
      class PerRequestAnalyser {
        @SequencedHandler({ channel: 'per-request' })
        async analyse(_payload: ReassembledPayload): Promise<void> {}
      }
      const transport = new InMemoryTransport();
      const logger = new CapturingLogger();
      const app = await boot(
        {
          imports: [
            SequenceModule.forRoot({
              transport,
              tuning: { sweepers: { expiry: { intervalMs: false } } },
            }),
          ],
          providers: [PerRequestAnalyser],
        },
        logger,
      );

      expect(app.get(ChannelRegistry).get('per-request')).toBeUndefined();
      expect(logger.warnings).toEqual([
        expect.stringContaining(
          '@SequencedHandler on PerRequestAnalyser.analyse is ignored: PerRequestAnalyser is ' +
            'request-scoped',
        ),
      ]);
      await publishAll(transport, 'per-request', makeFragments('s-1', bytes(10), 10));
      await transport.whenIdle();
      expect(transport.depth('per-request')).toBe(1);
    });

    it('ignores a @SequencedHandler on a transient provider and warns about it', async () => {
      @Injectable()
      class Archive {
        readonly saved: string[] = [];
      }
      @Injectable({ scope: Scope.TRANSIENT })
      class PerInjectionAnalyser {
        constructor(private readonly archive: Archive) {}
        @SequencedHandler({ channel: 'per-injection' })
        async analyse(payload: ReassembledPayload): Promise<void> {
          this.archive.saved.push(payload.sequenceId);
        }
      }
      const transport = new InMemoryTransport();
      const logger = new CapturingLogger();
      const app = await boot(
        {
          imports: [
            SequenceModule.forRoot({
              transport,
              tuning: { sweepers: { expiry: { intervalMs: false } } },
            }),
          ],
          providers: [Archive, PerInjectionAnalyser],
        },
        logger,
      );

      expect(app.get(ChannelRegistry).get('per-injection')).toBeUndefined();
      expect(logger.warnings).toEqual([
        expect.stringContaining(
          '@SequencedHandler on PerInjectionAnalyser.analyse is ignored: PerInjectionAnalyser ' +
            'is transient',
        ),
      ]);
      await publishAll(transport, 'per-injection', makeFragments('s-1', bytes(10), 10));
      await transport.whenIdle();
      expect(transport.depth('per-injection')).toBe(1);
    });

    it('fails the bootstrap when a handler decorator is on a static method, naming it', async () => {
      @Injectable()
      class Intake {
        @SequencedHandler({ channel: 'static-intake' })
        static async analyse(_payload: ReassembledPayload): Promise<void> {}
      }

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [Intake],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        '@SequencedHandler on Intake.analyse is on a static method, which no instance of ' +
          'Intake holds; make it an instance method',
      ]);
    });

    it('fails the bootstrap when one handler class is a provider of two modules, naming both', async () => {
      @Injectable()
      class Intake {
        @SequencedHandler({ channel: 'twice-provided' })
        async analyse(_payload: ReassembledPayload): Promise<void> {}
      }
      @Module({ providers: [Intake] })
      class CtModule {}
      @Module({ providers: [Intake] })
      class MrModule {}

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            isGlobal: true,
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
          CtModule,
          MrModule,
        ],
      });

      // Not "two handler methods (Intake.analyse and Intake.analyse)": one method, two instances.
      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toEqual([
        '@SequencedHandler on Intake.analyse: Intake is a provider of CtModule and of MrModule, ' +
          'so each instance would consume its channels; provide it in one module (and export ' +
          'it to the others)',
      ]);
    });

    it('finds a handler once when its provider is also registered under an alias', async () => {
      const Handler = recordingHandler({ channel: 'aliased' });
      const app = await boot({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [Handler, { provide: 'ANALYSER', useExisting: Handler }],
      });

      const { delivery } = await roundTrip(app, Handler, 'aliased', bytes(3 * KiB));
      expect(delivery.bytes).toEqual(bytes(3 * KiB));
    });

    it('finds a @SequencedHandler on a controller', async () => {
      @Controller()
      class IntakeController {
        readonly received: string[] = [];
        @SequencedHandler({ channel: 'intake' })
        async analyse(payload: ReassembledPayload): Promise<void> {
          this.received.push(payload.sequenceId);
        }
      }
      const app = await boot({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        controllers: [IntakeController],
      });

      const receipt = await app.get(SplitterService).send('intake', bytes(2 * KiB));
      const controller = app.get(IntakeController);
      await eventually(() => controller.received.length === 1, 'delivery to the controller');
      expect(controller.received).toEqual([receipt.sequenceId]);
    });

    it('fails the bootstrap when SequenceModule is imported twice', async () => {
      @Module({
        imports: [
          SequenceModule.forRoot({
            sequence: { fragmentBytes: 4 * KiB },
          }),
        ],
      })
      class ImagingModule {}

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            isGlobal: true,
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
          ImagingModule,
        ],
      });

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as Error).message).toContain('SequenceModule is imported 2 times');
    });

    it('fails the bootstrap when two @SequencedHandler methods share a channel, naming both', async () => {
      @Injectable()
      class CtAnalyser {
        @SequencedHandler({ channel: 'scans' })
        async analyse(_payload: ReassembledPayload): Promise<void> {}
      }
      @Injectable()
      class MrAnalyser {
        @SequencedHandler({ channel: 'scans' })
        async review(_payload: ReassembledPayload): Promise<void> {}
      }

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [CtAnalyser, MrAnalyser],
      });

      expect(error).toBeInstanceOf(SequenceHandlerConflictError);
      expect(error).toMatchObject({
        channel: 'scans',
        first: 'CtAnalyser.analyse',
        second: 'MrAnalyser.review',
      });
      expect((error as Error).message).toContain(
        'channel scans has two handler methods (CtAnalyser.analyse and MrAnalyser.review)',
      );
    });
  });

  describe('shutdown', () => {
    /** Stores half of a two-fragment sequence on `channel`, so the store has something open. */
    async function openOneSequence(transport: Transport, store: SequenceStore, channel: string) {
      const [first] = makeFragments('half', bytes(2_000), 1_000);
      await publishAll(transport, channel, [first]);
      await eventually(
        async () => (await store.stats(Date.now())).openSequences === 1,
        'one open sequence',
      );
    }

    it('closes the transport and store it created itself when the application closes', async () => {
      const Handler = recordingHandler({ channel: 'owned' });
      const moduleRef = await Test.createTestingModule({
        imports: [
          SequenceModule.forRoot({
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [Handler],
      }).compile();
      moduleRef.useLogger(false);
      const app = await moduleRef.init();
      const transport = app.get<Transport>(SEQUENCE_TRANSPORT);
      const store = app.get<SequenceStore>(SEQUENCE_STORE);
      await openOneSequence(transport, store, 'owned');

      await app.close();

      await expect(transport.publish('owned', Buffer.from('late'), {})).rejects.toThrow(
        'in-memory transport is closed',
      );
      expect((await store.stats(Date.now())).openSequences).toBe(0);
    });

    /** Refuses every subscription. */
    class Refuses extends ForwardingTransport {
      readonly name = 'refuses';
      override subscribe(): Promise<Subscription> {
        return Promise.reject(new Error('no channel'));
      }
    }

    it('closes the subscriptions it opened when a later one fails the bootstrap', async () => {
      class RefusingSecond extends ForwardingTransport {
        readonly name = 'refusing-second';
        private opened = 0;
        override subscribe(
          channel: string,
          handler: MessageHandler,
          options?: SubscribeOptions,
        ): Promise<Subscription> {
          if (++this.opened === 2) return Promise.reject(new Error('no channel left'));
          return super.subscribe(channel, handler, options);
        }
      }
      const inner = new InMemoryTransport();
      const First = recordingHandler({ channel: 'first' });
      const Second = recordingHandler({ channel: 'second' });

      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            transport: new RefusingSecond(inner),
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [First, Second],
      });

      expect((error as Error).message).toBe('no channel left');
      await publishAll(inner, 'first', makeFragments('s-1', bytes(10), 10));
      await inner.whenIdle();
      expect(inner.depth('first')).toBe(1);
      await inner.close();
    });

    it('closes its store sets and takes its metrics out of a given registry when the bootstrap fails', async () => {
      // Nest runs no shutdown hook after a failed init: a preset's connection would keep the
      // process alive, and the next application in it could not register the metrics again.
      const inner = new InMemoryTransport();
      const closed: string[] = [];
      const registry = new Registry();
      const error = await bootError({
        imports: [
          SequenceModule.forRoot({
            transport: new Refuses(inner),
            stores: { name: 'preset', close: async () => void closed.push('preset') },
            metrics: { registry },
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [recordingHandler({ channel: 'refused' })],
      });

      expect((error as Error).message).toBe('no channel');
      expect(closed).toEqual(['preset']);
      expect(registry.getMetricsAsArray()).toEqual([]);
      await inner.close();
    });

    describe('when one of its consumers fails to start, the others stop too (the app is never closed)', () => {
      /** Refuses to subscribe to one channel. */
      class Refusing extends ForwardingTransport {
        readonly name = 'refusing';
        constructor(
          inner: Transport,
          private readonly refused: string,
        ) {
          super(inner);
        }
        override subscribe(
          channel: string,
          handler: MessageHandler,
          options?: SubscribeOptions,
        ): Promise<Subscription> {
          if (channel === this.refused) return Promise.reject(new Error(`no ${channel}`));
          return super.subscribe(channel, handler, options);
        }
      }
      @Injectable()
      class Tasks {
        @InboxHandler({ event: 'TaskCreated' })
        async created(): Promise<void> {}
      }
      const Studies = recordingHandler({ channel: 'studies' });
      const taskCreated = {
        body: Buffer.from(
          JSON.stringify({
            id: 'task-1',
            type: 'TaskCreated',
            aggregateType: 'Task',
            aggregateId: 't-1',
            payload: {},
            occurredAt: new Date().toISOString(),
          }),
        ),
        headers: { [MESSAGE_ID_HEADER]: 'task-1', [MESSAGE_KIND_HEADER]: 'event' },
      };

      async function bootRefusing(refused: string): Promise<InMemoryTransport> {
        const inner = new InMemoryTransport();
        const error = await bootError({
          imports: [
            SequenceModule.forRoot({
              transport: new Refusing(inner, refused),
              outbox: {},
              tuning: { sweepers: { expiry: { intervalMs: false } } },
            }),
          ],
          providers: [Studies, Tasks],
        });
        expect((error as Error).message).toBe(`no ${refused}`);
        return inner;
      }

      it('the inbox stops when a sequence subscription fails', async () => {
        const inner = await bootRefusing('studies');
        await inner.publish('events.TaskCreated', taskCreated.body, taskCreated.headers);
        await inner.whenIdle();
        expect(inner.depth('events.TaskCreated')).toBe(1);
        await inner.close();
      });

      it('opens no subscription before the outbox has started: its inbox can record the first message', async () => {
        const events: string[] = [];
        class Recording extends ForwardingTransport {
          readonly name = 'recording';
          override subscribe(
            channel: string,
            handler: MessageHandler,
            options?: SubscribeOptions,
          ): Promise<Subscription> {
            events.push(`subscribe ${channel}`);
            return super.subscribe(channel, handler, options);
          }
        }
        const inner = new InMemoryTransport();
        const sqlite = await SqliteOutboxStore.open({ filename: ':memory:' });
        let releaseMigration!: () => void;
        const migrationHeld = new Promise<void>((resolve) => (releaseMigration = resolve));
        const store = new Proxy(sqlite, {
          get(target, property, receiver) {
            const value: unknown = Reflect.get(target, property, receiver);
            if (property !== 'migrate' || typeof value !== 'function') return value;
            return async () => {
              events.push('migrate');
              await migrationHeld;
              await (value as () => Promise<void>).apply(target);
              events.push('migrated');
            };
          },
        });

        const booting = boot({
          imports: [
            SequenceModule.forRoot({
              transport: new Recording(inner),
              outbox: { store },
              tuning: { sweepers: { expiry: { intervalMs: false } } },
            }),
          ],
          providers: [Studies, Tasks],
        });
        await eventually(() => events.length > 0, 'the migration started');
        await new Promise((resolve) => setTimeout(resolve, 50));
        expect(events).toEqual(['migrate']);

        releaseMigration();
        const app = await booting;
        expect(events.slice(0, 2)).toEqual(['migrate', 'migrated']);
        expect(events.slice(2).sort()).toEqual([
          'subscribe events.TaskCreated',
          'subscribe studies',
        ]);
        await app.close();
        apps.splice(apps.indexOf(app), 1);
        await sqlite.close();
        await inner.close();
      });

      it('the sequence consumers stop when the inbox subscription fails', async () => {
        const inner = await bootRefusing('events.TaskCreated');
        await publishAll(inner, 'studies', makeFragments('s-1', bytes(10), 10));
        await inner.whenIdle();
        expect(inner.depth('studies')).toBe(1);
        await inner.close();
      });
    });

    it('lets handlers in progress finish before deeper modules are destroyed', async () => {
      const probe = heldHandlerProbe();
      @Injectable()
      class Importer {
        constructor(private readonly database: ClosingDatabase) {}
        @SequencedHandler({ channel: 'studies' })
        async store(_payload: ReassembledPayload): Promise<void> {
          await probe.use(this.database);
        }
      }
      @Module({ imports: [ClosingDatabaseModule], providers: [Importer] })
      class ImportModule {}
      const transport = new InMemoryTransport();
      const moduleRef = await Test.createTestingModule({
        imports: [
          SequenceModule.forRoot({
            transport,
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
          ImportModule,
        ],
      }).compile();
      moduleRef.useLogger(false);
      const app = await moduleRef.init();
      await publishAll(transport, 'studies', makeFragments('s-1', bytes(10), 10));
      await eventually(() => probe.seen.length === 1, 'the handler running');

      await probe.closeWhileHandling(app);

      expect(probe.seen).toEqual([false, false]);
      await transport.close();
    });

    it('leaves a transport and store passed in by the user open', async () => {
      const transport = new InMemoryTransport();
      const store = new MemorySequenceStore();
      const Handler = recordingHandler({ channel: 'yours' });
      const moduleRef = await Test.createTestingModule({
        imports: [
          SequenceModule.forRoot({
            transport,
            sequence: { store },
            tuning: { sweepers: { expiry: { intervalMs: false } } },
          }),
        ],
        providers: [Handler],
      }).compile();
      moduleRef.useLogger(false);
      const app = await moduleRef.init();
      await openOneSequence(transport, store, 'yours');

      await app.close();

      await expect(transport.publish('yours', Buffer.from('later'), {})).resolves.toBeUndefined();
      expect(transport.depth('yours')).toBe(1);
      expect((await store.stats(Date.now())).openSequences).toBe(1);
      await transport.close();
      await store.close();
    });
  });
});
