import { createServer } from 'node:net';
import { killIfRunning, npmScript, run, start, type RunningProcess } from './support/demo-process';

/** The embedded defaults, whatever the environment of the test run says. */
const NO_SERVERS = {
  AMQP_URL: undefined,
  NATS_URL: undefined,
  REDIS_URL: undefined,
  PAYLOAD_DIR: undefined,
  CLAIM_CHECK_ABOVE_BYTES: undefined,
  CLAIM_CHECK_KEY: undefined,
};

/** A port nothing listens on right now (the OS picks it; freed again before the demo takes it). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address
          ? resolve(address.port)
          : reject(new Error('no port')),
      );
    });
  });
}

describe('npm start with CONSOLE_PORT', () => {
  let demo: RunningProcess | undefined;

  afterEach(async () => {
    await killIfRunning(demo);
    demo = undefined;
  });

  it('runs the demo, then goes on serving the console and its API until SIGINT', async () => {
    const port = await freePort();
    const [command, args] = npmScript('start');
    demo = start(command, args, {
      ...NO_SERVERS,
      STUDY_BYTES: String(2 * 1024 * 1024),
      CONSOLE_PORT: String(port),
    });
    await demo.waitForOutput('the console goes on serving', 180_000);
    const base = `http://127.0.0.1:${port}/sequence-admin`;
    expect(demo.output().stdout).toContain(`operator console on ${base}/`);
    expect(demo.output().stdout).toContain('matched');

    // After the run: the process is still up, and answers.
    const sequences = await fetch(`${base}/api/sequences`);
    expect(sequences.status).toBe(200);
    expect(await sequences.json()).toEqual({ items: [] });
    const page = await fetch(`${base}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(await page.text()).toContain('<title>nest-sequence console</title>');

    // Stopping it after the run is how it ends: a success.
    demo.child.kill('SIGINT');
    const exit = await demo.exited;
    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
  });

  it('exits 130, not 0, when interrupted during its run', async () => {
    const port = await freePort();
    const [command, args] = npmScript('start');
    demo = start(command, args, {
      ...NO_SERVERS,
      STUDY_BYTES: String(180 * 1024 * 1024),
      CONSOLE_PORT: String(port),
    });
    await demo.waitForOutput('operator console on', 180_000);

    demo.child.kill('SIGINT');
    const exit = await demo.exited;

    expect({ code: exit.code, stdout: exit.stdout }).toMatchObject({ code: 130 });
    expect(exit.stdout).not.toContain('matched');
  });

  it('refuses a CONSOLE_PORT that is not a port, naming it (exit code 2)', async () => {
    const [command, args] = npmScript('start');
    const exit = await run(command, args, { ...NO_SERVERS, CONSOLE_PORT: 'http' });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain('CONSOLE_PORT must be a TCP port');
  });
});
