import { createHash } from 'node:crypto';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { AppModule } from '../src/app.module';
import { readRecords, syntheticStudy } from '../src/imaging/dicom-like.records';
import { RESULTS_CHANNEL, type StudyReport } from '../src/imaging/imaging.channels';
import { PacsRouterService } from '../src/imaging/pacs-router.service';
import { DEMO_ADAPTERS } from '../src/infrastructure';
import { npmScript, run } from './support/demo-process';

const MiB = 1024 * 1024;
/** The embedded defaults, whatever the environment of the test run says. */
const NO_SERVERS = {
  AMQP_URL: undefined,
  NATS_URL: undefined,
  REDIS_URL: undefined,
  PAYLOAD_DIR: undefined,
  CLAIM_CHECK_ABOVE_BYTES: undefined,
  CLAIM_CHECK_KEY: undefined,
};

/** What the demo's synthetic study of `totalBytes` is, computed without the library. */
async function expectedStudy(totalBytes: number): Promise<{ sha256: string; records: number }> {
  const hash = createHash('sha256');
  for (const record of syntheticStudy(totalBytes)) hash.update(record);
  let records = 0;
  for await (const _record of readRecords(toAsync(syntheticStudy(totalBytes)))) records++;
  return { sha256: hash.digest('hex'), records };
}

async function* toAsync(records: Iterable<Buffer>): AsyncGenerator<Buffer> {
  yield* records;
}

/** Every file (not directory) under `root`, as paths relative to it. */
async function filesUnder(root: string): Promise<string[]> {
  const entries = await readdir(root, { recursive: true, withFileTypes: true });
  return entries
    .filter((entry) => !entry.isDirectory())
    .map((entry) => join(entry.parentPath, entry.name));
}

describe('imaging demo on the embedded defaults', () => {
  it('runs as a user starts it, and reports fragments, bytes, elapsed time and a matching SHA-256', async () => {
    const studyBytes = 20 * MiB;

    const exit = await run(
      'npx',
      ['ts-node', '-r', 'tsconfig-paths/register', '--swc', 'src/main.ts'],
      { ...NO_SERVERS, STUDY_BYTES: String(studyBytes) },
    );

    // stderr rides along so that a failure shows why the demo exited.
    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
    const expected = await expectedStudy(studyBytes);
    // 40 records of 512 KiB, packed whole into fragments of at most 8 MiB: 16 + 16 + 8 records.
    expect(exit.stdout).toContain(
      `study 1.2.840.99999.1: 3 fragments, ${studyBytes} bytes, via sequence`,
    );
    expect(exit.stdout).toMatch(/sent and reassembled in \d+ ms \(\d+(\.\d+)? MB\/s\)/);
    expect(exit.stdout).toContain(`${expected.records} records analysed`);
    expect(exit.stdout).toContain(`sha256 ${expected.sha256} matched`);
  });

  describe('with a study above CLAIM_CHECK_ABOVE_BYTES', () => {
    let payloadDir: string;

    beforeEach(async () => {
      payloadDir = await mkdtemp(join(tmpdir(), 'demo-e2e-payloads-'));
    });

    afterEach(async () => {
      await rm(payloadDir, { recursive: true, force: true });
    });

    it('npm start parks it in PAYLOAD_DIR, sends a ticket, and the report matches its SHA-256', async () => {
      const studyBytes = 5 * MiB;

      const exit = await run('npm', ['start'], {
        ...NO_SERVERS,
        STUDY_BYTES: String(studyBytes),
        CLAIM_CHECK_ABOVE_BYTES: String(1 * MiB),
        PAYLOAD_DIR: payloadDir,
      });

      expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
      const expected = await expectedStudy(studyBytes);
      expect(exit.stdout).toContain(
        `study 1.2.840.99999.1: 1 fragment, ${studyBytes} bytes, via ticket`,
      );
      expect(exit.stdout).toMatch(/sent and claimed in \d+ ms/);
      expect(exit.stdout).toContain(`${expected.records} records analysed`);
      expect(exit.stdout).toContain(`sha256 ${expected.sha256} matched`);
    });

    it('npm start deletes the parked study once the AI service handled it', async () => {
      const exit = await run('npm', ['start'], {
        ...NO_SERVERS,
        STUDY_BYTES: String(5 * MiB),
        CLAIM_CHECK_ABOVE_BYTES: String(1 * MiB),
        PAYLOAD_DIR: payloadDir,
      });

      expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
      expect(exit.stdout).toContain('via ticket');
      // The store made its day directories under the root (it was used), and no file is left.
      expect((await readdir(payloadDir)).length).toBeGreaterThan(0);
      expect(await filesUnder(payloadDir)).toEqual([]);
    });
  });

  it('npm start sends a study up to CLAIM_CHECK_ABOVE_BYTES as a sequence', async () => {
    const studyBytes = 5 * MiB;

    const exit = await run('npm', ['start'], {
      ...NO_SERVERS,
      STUDY_BYTES: String(studyBytes),
      CLAIM_CHECK_ABOVE_BYTES: String(studyBytes),
    });

    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
    expect(exit.stdout).toContain(`1 fragment, ${studyBytes} bytes, via sequence`);
    expect(exit.stdout).toContain(`sha256 ${(await expectedStudy(studyBytes)).sha256} matched`);
  });

  it('npm start refuses a CLAIM_CHECK_ABOVE_BYTES, CLAIM_CHECK_KEY or STUDY_BYTES it cannot use, naming each', async () => {
    const exit = await run('npm', ['start'], {
      ...NO_SERVERS,
      CLAIM_CHECK_ABOVE_BYTES: '1e6',
      CLAIM_CHECK_KEY: 'too short',
      STUDY_BYTES: 'abc',
    });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain(
      'CLAIM_CHECK_ABOVE_BYTES must be a whole number of bytes, got "1e6"',
    );
    expect(exit.stderr).toContain('CLAIM_CHECK_KEY is 9 bytes; use a secret of at least 32 bytes');
    expect(exit.stderr).toContain(
      'STUDY_BYTES must be a whole number of bytes, at least 8, got "abc"',
    );
  });

  it('npm start refuses a server variable that is not a URL of its kind, naming each', async () => {
    const exit = await run('npm', ['start'], {
      ...NO_SERVERS,
      AMQP_URL: 'guest:secret@localhost',
      REDIS_URL: '127.0.0.1:6379',
      DATABASE_URL: 'mysql://localhost/test',
    });

    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 2 });
    expect(exit.stderr).toContain('AMQP_URL must be a URL starting amqp:// or amqps://');
    expect(exit.stderr).toContain('REDIS_URL must be a URL starting redis:// or rediss://');
    expect(exit.stderr).toContain(
      'DATABASE_URL must be a URL starting postgres:// or postgresql://',
    );
    expect(exit.stderr).not.toContain('secret');
  });

  it('npm start names each server it cannot reach in a line, and exits 1', async () => {
    // Nothing listens on port 1.
    const exit = await run('npm', ['start'], {
      ...NO_SERVERS,
      AMQP_URL: 'amqp://guest:secret@127.0.0.1:1',
      REDIS_URL: 'redis://127.0.0.1:1',
    });

    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 1 });
    expect(exit.stderr).toContain(
      'cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:1 (AMQP_URL): connect ECONNREFUSED',
    );
    expect(exit.stderr).toContain(
      'cannot reach Redis at redis://127.0.0.1:1 (REDIS_URL): connect ECONNREFUSED',
    );
    expect(exit.stderr).not.toContain('secret');
    expect(exit.stderr).not.toMatch(/^\s+at /m);
  });

  it.each([
    ['npm start', 'npm', ['start']],
    ['demo:consumer', ...npmScript('demo:consumer')],
    ['demo:transfers', ...npmScript('demo:transfers')],
  ] as const)(
    '%s refuses AMQP_URL and NATS_URL set together, naming both',
    async (_name, command, args) => {
      // Checked before connecting: nothing listens on port 1.
      const exit = await run(command, [...args], {
        ...NO_SERVERS,
        AMQP_URL: 'amqp://guest:guest@127.0.0.1:1',
        NATS_URL: 'nats://127.0.0.1:1',
        CLAIM_CHECK_KEY: 'k'.repeat(32),
      });

      expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({
        code: 2,
        stderr: expect.stringContaining(
          'AMQP_URL and NATS_URL are both set; the demo runs on one broker',
        ),
      });
    },
  );

  it.each([8, 9, 15, 16, 512 * 1024 + 3, 3 * 512 * 1024 + 7])(
    'the synthetic study of %i bytes has exactly that many, in whole records',
    async (totalBytes) => {
      const records = [...syntheticStudy(totalBytes)];
      expect(records.reduce((sum, record) => sum + record.length, 0)).toBe(totalBytes);
      let read = 0;
      for await (const record of readRecords(toAsync(records))) read += 8 + record.value.length;
      expect(read).toBe(totalBytes);
    },
  );

  it.each(['demo:producer', 'demo:consumer'])(
    '%s refuses to start over RabbitMQ without CLAIM_CHECK_KEY, naming it',
    async (script) => {
      // Checked before connecting: nothing listens on port 1.
      const args = script === 'demo:producer' ? ['--bytes', '1000'] : [];
      const exit = await run(...npmScript(script, ...args), {
        ...NO_SERVERS,
        AMQP_URL: 'amqp://guest:guest@127.0.0.1:1',
      });

      expect(exit.code).toBe(2);
      expect(exit.stderr).toContain(`${script} signs or verifies claim tickets`);
      expect(exit.stderr).toContain('set CLAIM_CHECK_KEY to the same secret');
    },
  );

  it('demo:producer refuses a --bytes that is not a whole number, with its usage', async () => {
    const exit = await run(...npmScript('demo:producer', '--bytes', '3e7'), NO_SERVERS);

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain('--bytes must be a whole number of bytes, at least 8, got "3e7"');
    expect(exit.stderr).toContain('usage: npm run demo:producer -- --bytes N');
  });

  describe('in process', () => {
    let app: INestApplicationContext;

    beforeEach(async () => {
      const moduleRef = await Test.createTestingModule({ imports: [AppModule] })
        .overrideProvider(DEMO_ADAPTERS)
        .useValue({})
        .compile();
      moduleRef.useLogger(false);
      app = await moduleRef.init();
    });

    afterEach(async () => {
      await app.close();
    });

    it("reports as many records, and the same SHA-256, as the PACS router's receipt", async () => {
      // Not a whole number of records: the last one is short.
      const studyBytes = 10 * MiB + 1_000;
      const reports: StudyReport[] = [];
      await app.get<Transport>(SEQUENCE_TRANSPORT).subscribe(RESULTS_CHANNEL, async (message) => {
        reports.push(JSON.parse(message.body.toString('utf8')) as StudyReport);
        return { action: 'ack' };
      });

      const receipt = await app.get(PacsRouterService).sendStudy('1.2.840.99999.7', studyBytes);
      const deadline = Date.now() + 30_000;
      while (reports.length === 0 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 10));
      }

      const expected = await expectedStudy(studyBytes);
      expect(reports).toHaveLength(1);
      expect(reports[0]).toEqual({
        sequenceId: receipt.sequenceId,
        studyUid: '1.2.840.99999.7',
        via: 'sequence',
        fragments: receipt.fragments,
        bytes: receipt.bytes,
        sha256: receipt.sha256,
        records: expected.records,
        meanIntensity: expect.any(Number),
        status: 'ok',
      });
      expect(receipt).toMatchObject({
        via: 'sequence',
        bytes: studyBytes,
        sha256: expected.sha256,
      });
      expect(expected.records).toBe(21);
    });
  });
});
