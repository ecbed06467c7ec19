import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';

jest.setTimeout(60_000);

const ROOT = resolve(__dirname, '../../../..');
const FIXTURE = join(__dirname, 'processes', 'fixtures', 'needs-redis.fixture.ts');
/** Loopback port 1: nothing listens there, so the connection is refused at once. */
const NOWHERE = 'redis://127.0.0.1:1';

/** Runs jest on the fixture alone, with `ci` as the CI variable (unset when undefined). */
function runFixture(ci: string | undefined) {
  const config = {
    rootDir: ROOT,
    testMatch: [FIXTURE],
    transform: {
      '^.+\\.ts$': ['ts-jest', { tsconfig: join(ROOT, 'tsconfig.json'), isolatedModules: true }],
    },
    moduleFileExtensions: ['ts', 'js', 'json'],
    testEnvironment: 'node',
  };
  // No colours: jest's workers set FORCE_COLOR, and escape codes would split the summary line.
  const env: NodeJS.ProcessEnv = { ...process.env, REDIS_URL: NOWHERE, FORCE_COLOR: '0' };
  delete env.CI;
  if (ci !== undefined) env.CI = ci;
  const result = spawnSync(
    process.execPath,
    [require.resolve('jest/bin/jest'), '--config', JSON.stringify(config), '--ci=false'],
    { cwd: ROOT, env, encoding: 'utf8', timeout: 50_000 },
  );
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

/** The rule every integration test follows through describeWithServer. */
describe('describeWithServer when its server does not answer', () => {
  it.each(['true', '1'])('fails the block under CI=%s, naming the server and its URL', (ci) => {
    const { status, output } = runFixture(ci);
    expect({ status, output }).toMatchObject({ status: 1 }); // the output shows when it is not
    expect(output).toContain('needs redis');
    expect(output).toContain(`redis is not reachable at ${NOWHERE}`);
    expect(output).toMatch(/Tests:\s+1 failed, 1 total/);
  });

  it('skips the block, saying so, outside CI', () => {
    const { status, output } = runFixture(undefined);
    expect({ status, output }).toMatchObject({ status: 0 });
    expect(output).toContain('skipping "a block that needs Redis"');
    expect(output).toMatch(/Tests:\s+1 skipped, 1 total/);
  });
});
