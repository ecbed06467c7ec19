import { randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, relative } from 'node:path';
import * as amqplib from 'amqplib';
import { Redis } from 'ioredis';
import * as ts from 'typescript';
import { describeWithServer, isReachable, SERVERS } from '../libs/sequence/test/support/servers';
import { assertSucceeded, ConsumerApp, exec, ROOT, type Exit } from './support/consumer-app';

/**
 * nest-sequence as a user gets it: `npm run package` builds the tarball once, and fresh Nest 11
 * applications outside the repository install it with only the peers they use, compile it
 * (strict, skipLibCheck false, moduleResolution node10 and node16) and send 40 MB through it.
 */

interface Manifest {
  name: string;
  version: string;
  main: string;
  types: string;
  exports: Record<string, string | Record<string, string>>;
  typesVersions: Record<string, Record<string, string[]>>;
  bin: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
}

const LIBRARY = join(ROOT, 'libs/sequence');
const source = JSON.parse(readFileSync(join(LIBRARY, 'package.json'), 'utf8')) as Manifest;
const TARBALL = join(ROOT, 'dist', `nest-sequence-${source.version}.tgz`);
/** The staging directory `npm run package` packed: the tarball's contents. */
const STAGED = join(ROOT, 'dist/package');

const optionalPeers = Object.keys(source.peerDependencies).filter(
  (name) => source.peerDependenciesMeta[name]?.optional,
);
const requiredPeers = Object.keys(source.peerDependencies).filter(
  (name) => !optionalPeers.includes(name),
);

function filesUnder(directory: string): string[] {
  return readdirSync(directory, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => relative(directory, join(entry.parentPath, entry.name)));
}

/** `./redis.d.ts` → `redis.d.ts`: the paths a manifest names, as the tarball lists them. */
function manifestTargets(manifest: Manifest): string[] {
  const targets = [manifest.main, manifest.types, ...Object.values(manifest.bin)];
  for (const target of Object.values(manifest.exports)) {
    targets.push(...(typeof target === 'string' ? [target] : Object.values(target)));
  }
  for (const paths of Object.values(manifest.typesVersions['*'])) targets.push(...paths);
  return targets.map((target) => target.replace(/^\.\//, ''));
}

/** The names a declaration file exports, as TypeScript sees them (re-exports resolved). */
function exportedNames(declarationFile: string): string[] {
  const program = ts.createProgram([declarationFile], { noEmit: true, types: [] });
  const module = program
    .getTypeChecker()
    .getSymbolAtLocation(program.getSourceFile(declarationFile)!);
  if (!module) throw new Error(`${declarationFile} is not a module`);
  return program
    .getTypeChecker()
    .getExportsOfModule(module)
    .map((symbol) => symbol.getName());
}

function roundTrip(exit: Exit): Record<string, unknown> {
  assertSucceeded(exit, 'the application');
  const line = /^round trip (.*)$/m.exec(exit.stdout);
  if (!line) throw new Error(`no round trip printed\n${exit.stdout}\n${exit.stderr}`);
  return JSON.parse(line[1]) as Record<string, unknown>;
}

const MiB = 1024 * 1024;

/**
 * Starts tsc on each of `projects` of `app` at once, answering each one's exit by project: the
 * compiles (single-threaded, seconds each) overlap on a machine with more than one core. None
 * writes where another reads: only `tsconfig.json` emits.
 */
function compileAll(app: ConsumerApp, projects: readonly string[]): Map<string, Promise<Exit>> {
  const exits = new Map<string, Promise<Exit>>();
  for (const project of projects) {
    const exit = app.tsc(project);
    exit.catch(() => undefined); // awaited by its test; not an unhandled rejection meanwhile
    exits.set(project, exit);
  }
  return exits;
}

interface Prepared {
  app: ConsumerApp;
  compiles: Map<string, Promise<Exit>>;
}

/** Preparations registered by the blocks that will run, started once the tarball is packed. */
const preparations: (() => void)[] = [];

/**
 * Installs an application (`ConsumerApp.install(options)`), lets `setUp` add to it, and starts
 * compiling its `projects`. It starts as soon as the top-level beforeAll has packed the tarball,
 * so that each application's install (npm, mostly waiting on its cache and the disk) and compiles
 * overlap the other application's and the checks of the tarball; the block's own beforeAll awaits
 * it (and starts it, if packing failed). `runs` says whether the calling block will run: a skipped
 * block's afterAll would not remove the application.
 */
function prepareOncePacked(
  runs: boolean,
  options: Parameters<typeof ConsumerApp.install>[0],
  projects: readonly string[],
  setUp: (app: ConsumerApp) => void = () => undefined,
): () => Promise<Prepared> {
  let preparing: Promise<Prepared> | undefined;
  const prepare = () =>
    (preparing ??= ConsumerApp.install(options).then((app) => {
      try {
        setUp(app);
      } catch (error) {
        app.remove();
        throw error;
      }
      return { app, compiles: compileAll(app, projects) };
    }));
  if (runs) preparations.push(() => void prepare().catch(() => undefined));
  return prepare;
}

describe('the nest-sequence package', () => {
  let files: string[];
  let manifest: Manifest;

  beforeAll(async () => {
    assertSucceeded(
      await exec('npm', ['run', 'package'], { cwd: ROOT, timeoutMs: 300_000 }),
      'npm run package',
    );
    const listed = await exec('tar', ['-tzf', TARBALL], { cwd: ROOT, timeoutMs: 30_000 });
    assertSucceeded(listed, `tar -tzf ${TARBALL}`);
    files = listed.stdout
      .split('\n')
      .filter(Boolean)
      .map((path) => path.replace(/^package\//, ''));
    manifest = JSON.parse(readFileSync(join(STAGED, 'package.json'), 'utf8')) as Manifest;
    for (const start of preparations) start();
  }, 300_000);

  it('holds no tests and no TypeScript sources', () => {
    expect(files.filter((file) => /\.(e2e-)?spec\./.test(file))).toEqual([]);
    expect(files.filter((file) => file.endsWith('.ts') && !file.endsWith('.d.ts'))).toEqual([]);
    expect(files.filter((file) => /^(test|libs|src)\//.test(file))).toEqual([]);
  });

  it('holds every Lua script, SQL file and console page file next to the code that loads them', () => {
    const assets = filesUnder(join(LIBRARY, 'src')).filter(
      (file) =>
        /\.(lua|sql)$/.test(file) || /^admin\/console\/page\/[^/]+\.(html|css|js|svg)$/.test(file),
    );
    expect(assets).toEqual(expect.arrayContaining(['admin/console/page/index.html']));
    expect(assets.filter((asset) => !files.includes(asset))).toEqual([]);
  });

  it('holds its README, LICENSE and CHANGELOG', () => {
    expect(files).toEqual(
      expect.arrayContaining(['README.md', 'LICENSE', 'CHANGELOG.md', 'package.json']),
    );
  });

  it('has a file for every path its package.json names', () => {
    expect(manifestTargets(manifest).filter((target) => !files.includes(target))).toEqual([]);
  });

  it('maps its entry points as the repository does in tsconfig.json and jest', () => {
    const entryPoints = Object.keys(source.exports).map((subpath) =>
      subpath.replace(/^\./, 'nest-sequence'),
    );
    const tsconfig = JSON.parse(readFileSync(join(ROOT, 'tsconfig.json'), 'utf8')) as {
      compilerOptions: { paths: Record<string, string[]> };
    };
    expect(Object.keys(tsconfig.compilerOptions.paths).sort()).toEqual([...entryPoints].sort());
    const jest = createRequire(__filename)(join(ROOT, 'jest.config.js')) as {
      projects: { moduleNameMapper: Record<string, string> }[];
    };
    const patterns = Object.keys(jest.projects[0].moduleNameMapper).map((key) => new RegExp(key));
    const unmapped = entryPoints.filter((name) => !patterns.some((pattern) => pattern.test(name)));
    expect(unmapped).toEqual([]);
  });

  it('publishes every entry point with its types, for node10 resolution too', () => {
    const subpaths = Object.keys(source.exports).filter((subpath) => subpath !== '.');
    expect(Object.keys(manifest.exports).sort()).toEqual(
      ['.', ...subpaths, './package.json'].sort(),
    );
    for (const subpath of ['.', ...subpaths]) {
      expect(Object.keys(manifest.exports[subpath])).toEqual(['types', 'require', 'default']);
    }
    expect(Object.keys(manifest.typesVersions['*']).sort()).toEqual(
      subpaths.map((subpath) => subpath.slice(2)).sort(),
    );
  });

  it("declares the peers of libs/sequence/package.json, the backends' clients optional", () => {
    expect(manifest.peerDependencies).toEqual(source.peerDependencies);
    expect(manifest.peerDependenciesMeta).toEqual(source.peerDependenciesMeta);
    expect(optionalPeers).toEqual(expect.arrayContaining(['ioredis', 'pg', 'better-sqlite3']));
  });

  it('keeps the root entry point small: at most 80 exported names', () => {
    const names = exportedNames(join(STAGED, 'index.d.ts'));
    expect(names).toContain('SequenceModule');
    expect(names.length).toBeLessThanOrEqual(80);
  });

  it('tells in its README which peers to install for each entry point', () => {
    const readme = readFileSync(join(STAGED, 'README.md'), 'utf8');
    const installLine = /^npm install nest-sequence (.*)$/m.exec(readme)?.[1] ?? '';
    const installed = installLine.split(' ').map((spec) => spec.replace(/(.)@[^@]*$/, '$1'));
    expect(installed.sort()).toEqual([...requiredPeers].sort());
    for (const peer of optionalPeers) expect(readme).toContain(`${peer}@`);
  });

  describe('in an application on the embedded defaults', () => {
    let app: ConsumerApp | undefined;
    let compiles: Map<string, Promise<Exit>>;
    const prepare = prepareOncePacked(
      true,
      {
        name: 'embedded',
        tarball: TARBALL,
        dependencies: [...requiredPeers, '@types/node'],
        files: {
          'src/main.ts': 'test/package/embedded.main.ts',
          'src/scan-round-trip.ts': 'test/package/scan-round-trip.ts',
          'probes/redis-without-ioredis.ts': 'test/package/redis-without-ioredis.ts',
        },
        probes: ['probes/redis-without-ioredis.ts'],
      },
      ['tsconfig.json', 'tsconfig.node16.json', 'tsconfig.redis-without-ioredis.json'],
      (installed) => {
        // The README's example, as installed: it compiles with the application.
        const readme = readFileSync(
          join(installed.dir, 'node_modules/nest-sequence/README.md'),
          'utf8',
        );
        installed.write('src/readme-example.ts', /```ts\n([\s\S]*?)```/.exec(readme)![1]);
      },
    );

    beforeAll(async () => {
      ({ app, compiles } = await prepare());
    }, 300_000);

    afterAll(() => app?.remove());

    it('installs none of the optional peers', () => {
      // prom-client, a required peer, depends on @opentelemetry/api: it comes with it.
      const present = optionalPeers.filter(
        (peer) => peer !== '@opentelemetry/api' && existsSync(join(app!.dir, 'node_modules', peer)),
      );
      expect(present).toEqual([]);
    });

    it('compiles with moduleResolution node10', async () => {
      assertSucceeded(await compiles.get('tsconfig.json')!, 'tsc (node10)');
    }, 120_000);

    it('compiles with moduleResolution node16', async () => {
      assertSucceeded(await compiles.get('tsconfig.node16.json')!, 'tsc (node16)');
    }, 120_000);

    it('reassembles a 40 MB sequence, its SHA-256 intact', async () => {
      assertSucceeded(await compiles.get('tsconfig.json')!, 'tsc (node10)');
      const result = roundTrip(await app!.node('dist/main.js'));
      expect(result.receivedBytes).toBe(40 * MiB);
      expect(result.receivedSha256).toBe(result.sentSha256);
      expect(result.fragments).toBeGreaterThan(1);
    }, 120_000);

    it('does not compile an import of nest-sequence/redis without ioredis', async () => {
      const exit = await compiles.get('tsconfig.redis-without-ioredis.json')!;
      expect(exit.code).not.toBe(0);
      expect(exit.stdout).toContain("Cannot find module 'ioredis'");
    }, 120_000);

    it('links the outbox migration command', async () => {
      const command = join(app!.dir, 'node_modules/.bin/nest-sequence-outbox-migrate');
      const exit = await exec(command, ['--help'], {
        cwd: app!.dir,
        env: { DATABASE_URL: '' },
        timeoutMs: 30_000,
      });
      expect(exit.stdout + exit.stderr).toContain('usage: nest-sequence-outbox-migrate');
    }, 30_000);
  });

  describeWithServer('rabbitmq', 'in an application on RabbitMQ', () => {
    describeWithServer('redis', 'and Redis, through the subpath entry points', () => {
      const unique = `package-e2e-${randomUUID().slice(0, 8)}`;
      let app: ConsumerApp | undefined;
      let compiles: Map<string, Promise<Exit>>;
      const prepare = prepareOncePacked(
        isReachable('rabbitmq') && isReachable('redis'),
        {
          name: 'rabbitmq-redis',
          tarball: TARBALL,
          dependencies: [
            ...requiredPeers,
            '@types/node',
            // As the README says for nest-sequence/rabbitmq and nest-sequence/redis.
            '@golevelup/nestjs-rabbitmq',
            'amqplib',
            '@types/amqplib',
            'ioredis',
          ],
          files: {
            'src/main.ts': 'test/package/rabbitmq-redis.main.ts',
            'src/scan-round-trip.ts': 'test/package/scan-round-trip.ts',
          },
        },
        ['tsconfig.json', 'tsconfig.node16.json'],
      );

      beforeAll(async () => {
        ({ app, compiles } = await prepare());
      }, 300_000);

      afterAll(async () => {
        app?.remove();
        const connection = await amqplib.connect(SERVERS.rabbitmq.url);
        const channel = await connection.createChannel();
        for (const queue of [unique, `${unique}.dlq`, `${unique}.dlq.dlq`]) {
          await channel.deleteQueue(queue);
        }
        await connection.close();
        const redis = new Redis(SERVERS.redis.url);
        const keys = await redis.keys(`${unique}:*`);
        if (keys.length > 0) await redis.del(...keys);
        redis.disconnect();
      });

      it('compiles with moduleResolution node10', async () => {
        assertSucceeded(await compiles.get('tsconfig.json')!, 'tsc (node10)');
      }, 120_000);

      it('compiles with moduleResolution node16', async () => {
        assertSucceeded(await compiles.get('tsconfig.node16.json')!, 'tsc (node16)');
      }, 120_000);

      it('reassembles a 40 MB sequence, its SHA-256 intact', async () => {
        assertSucceeded(await compiles.get('tsconfig.json')!, 'tsc (node10)');
        const result = roundTrip(
          await app!.node('dist/main.js', {
            AMQP_URL: SERVERS.rabbitmq.url,
            REDIS_URL: SERVERS.redis.url,
            REDIS_PREFIX: unique,
            SCAN_CHANNEL: unique,
          }),
        );
        expect(result.receivedBytes).toBe(40 * MiB);
        expect(result.receivedSha256).toBe(result.sentSha256);
        expect(result.fragments).toBeGreaterThan(1);
      }, 120_000);
    });
  });
});
