import type { INestApplicationContext } from '@nestjs/common';
import { ServiceUnavailableException } from '@nestjs/common';
import { HealthCheckService } from '@nestjs/terminus';
import { Test } from '@nestjs/testing';
import {
  MemoryResequencerStore,
  ResequencerService,
  SequenceModule,
  SequenceOptionsError,
  type SequenceModuleOptions,
  type SequenceStore,
} from 'nest-sequence';
import {
  ResequencerHealthIndicator,
  SequenceHealthIndicator,
  SequenceHealthModule,
  type SequenceHealthOptions,
} from 'nest-sequence/health';
import { crc32 } from '../core/checksum';
import { RESEQUENCER_STORE, SEQUENCE_STORE } from '../kernel/tokens';
import type { ResequencerStore } from '../ports/resequencer-store.port';

const NO_SWEEPERS = {
  sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } },
} as const;

/** Opens a sequence whose first fragment arrived at `now`, declaring `bytes` in all. */
async function openSequence(store: SequenceStore, bytes: number, now = Date.now()): Promise<void> {
  const body = Buffer.alloc(1_000, 1);
  await store.accept(
    {
      scope: 'scans',
      sequenceId: `study-${now}-${bytes}`,
      position: 1,
      size: 3,
      last: false,
      crc32: crc32(body),
      bytes,
      userHeaders: {},
      body,
    },
    {
      now,
      consumerId: 'c',
      leaseMs: 1_000,
      expiry: { ms: 300_000, strategy: 'fixed' },
      retentionMs: 1_000,
      limits: {
        maxSequenceBytes: 100_000,
        maxFragments: 10,
        maxBufferedBytes: 100_000,
        maxOpenSequences: 10,
      },
    },
  );
}

describe('health thresholds', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(
    health?: SequenceHealthOptions,
    options: SequenceModuleOptions = {},
  ): Promise<INestApplicationContext> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
          sequence: { maxBufferedBytes: 100_000, maxSequenceBytes: 90_000 },
          tuning: NO_SWEEPERS,
          ...options,
        }),
        health === undefined ? SequenceHealthModule : SequenceHealthModule.forRoot(health),
      ],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    return app;
  }

  describe('sequence', () => {
    it('is down once the buffer reaches 80% by default, and HealthCheckService answers 503 naming the threshold', async () => {
      const started = await start();
      await openSequence(started.get<SequenceStore>(SEQUENCE_STORE), 85_000);
      const indicator = started.get(SequenceHealthIndicator);

      const check = started.get(HealthCheckService).check([() => indicator.isHealthy('sequence')]);

      const error = await check.then(
        () => undefined,
        (thrown: unknown) => thrown,
      );
      expect(error).toBeInstanceOf(ServiceUnavailableException);
      const body = (error as ServiceUnavailableException).getResponse() as {
        status: string;
        error: Record<string, { tripped: unknown[]; buffer: { usedPercent: number } }>;
      };
      expect(body.status).toBe('error');
      const { tripped, buffer } = body.error.sequence;
      expect(buffer.usedPercent).toBeGreaterThanOrEqual(80);
      expect(tripped).toEqual([
        {
          threshold: 'sequence.bufferPercent',
          value: buffer.usedPercent,
          limit: 80,
          message: `sequence buffer ${buffer.usedPercent}% used (stored and reserved of 100000 bytes), limit 80%`,
          runbook: 'docs/operations.md#buffer-full',
        },
      ]);
    });

    it('warns, staying up, from 80% of the limit (64% used)', async () => {
      const started = await start();
      await openSequence(started.get<SequenceStore>(SEQUENCE_STORE), 70_000);
      const result = await started.get(SequenceHealthIndicator).isHealthy('sequence');
      expect(result.sequence.status).toBe('up');
      expect(result.sequence.tripped).toBeUndefined();
      expect(result.sequence.warnings).toEqual([
        expect.objectContaining({ threshold: 'sequence.bufferPercent', limit: 80 }),
      ]);
    });

    it('judges no threshold when the call says thresholds: false (a readiness probe)', async () => {
      const started = await start();
      await openSequence(started.get<SequenceStore>(SEQUENCE_STORE), 85_000);
      const result = await started
        .get(SequenceHealthIndicator)
        .isHealthy('sequence', { thresholds: false });
      expect(result.sequence.status).toBe('up');
      expect(result.sequence.buffer?.usedPercent).toBeGreaterThanOrEqual(80);
      expect(result.sequence).not.toHaveProperty('tripped');
    });

    it('judges the percent given to forRoot instead', async () => {
      const started = await start({ sequence: { bufferPercent: 95 }, warnRatio: false });
      await openSequence(started.get<SequenceStore>(SEQUENCE_STORE), 85_000);
      const result = await started.get(SequenceHealthIndicator).isHealthy('sequence');
      expect(result.sequence.status).toBe('up');
      expect(result.sequence).not.toHaveProperty('warnings');
    });

    it('is down when the oldest open sequence is older than the sequence timeout', async () => {
      const started = await start(undefined, {
        sequence: { maxBufferedBytes: 100_000, maxSequenceBytes: 90_000, timeoutMs: 300_000 },
      });
      await openSequence(started.get<SequenceStore>(SEQUENCE_STORE), 3_000, Date.now() - 400_000);
      const result = await started.get(SequenceHealthIndicator).isHealthy('sequence');
      expect(result.sequence.status).toBe('down');
      expect(result.sequence.buffer?.oldestOpenAgeMs).toBeGreaterThanOrEqual(400_000);
      expect(result.sequence.tripped).toEqual([
        expect.objectContaining({
          threshold: 'sequence.oldestOpenAgeMs',
          limit: 300_000,
          runbook: 'docs/operations.md#sequence-too-old',
        }),
      ]);
      expect(result.sequence.tripped?.[0].message).toMatch(
        /^oldest open sequence 6\.\d min old, limit 5 min \(sequence\.timeoutMs and one expiry sweep\)$/,
      );
    });
  });

  describe('resequencer', () => {
    it('is down when a gap is open past its gap.timeoutMs, naming the resequencer', async () => {
      const started = await start(undefined, {
        resequencer: { store: new MemoryResequencerStore() },
      });
      started
        .get(ResequencerService)
        .create(
          { channel: 'orders', gap: { timeoutMs: 60_000, policy: 'alert' } },
          () => undefined,
        );
      // Event 2 of key K arrived two minutes ago; 1 never came.
      await started.get<ResequencerStore>(RESEQUENCER_STORE).accept(
        { scope: 'orders', key: 'K' },
        { seq: 2, body: Buffer.from('two'), headers: {} },
        {
          start: 1,
          limits: { maxBufferedPerKey: 10, maxBufferedTotal: 10 },
          now: Date.now() - 120_000,
        },
      );
      const result = await started.get(ResequencerHealthIndicator).isHealthy('resequencer');
      expect(result.resequencer.status).toBe('down');
      expect(result.resequencer.gaps?.orders).toEqual({
        openGaps: 1,
        oldestGapAgeMs: expect.any(Number),
        timeoutMs: 60_000,
        policy: 'alert',
      });
      expect(result.resequencer.tripped).toEqual([
        expect.objectContaining({
          threshold: 'resequencer.oldestGapAgeMs',
          subject: 'orders',
          limit: 60_000,
          runbook: 'docs/operations.md#open-gap',
        }),
      ]);
    });
  });

  it('refuses bad thresholds when the module is built, listing each', () => {
    expect(() =>
      SequenceHealthModule.forRoot({ sequence: { bufferPercent: 0 }, outbox: { lagMs: -1 } }),
    ).toThrow(SequenceOptionsError);
    expect(() => SequenceHealthModule.forRoot({ outbox: { lagMs: -1 } })).toThrow(
      /outbox\.lagMs must be a whole number of ms of at least 1, or false; got -1/,
    );
  });
});
