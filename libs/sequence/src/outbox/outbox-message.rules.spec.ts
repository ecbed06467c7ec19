import { execFileSync } from 'node:child_process';
import { join, resolve } from 'node:path';

const ROOT = resolve(__dirname, '../../../..');

/**
 * Runs `script` in a fresh Node process with the library's sources loaded through ts-node (Jest's
 * own module registry would hide what Node itself loads) and returns what it printed, as JSON.
 */
function inFreshProcess(script: string): Record<string, unknown> {
  const output = execFileSync(
    process.execPath,
    ['-r', 'ts-node/register/transpile-only', '-r', 'tsconfig-paths/register', '-e', script],
    {
      cwd: ROOT,
      env: { ...process.env, TS_NODE_PROJECT: join(ROOT, 'tsconfig.json') },
      encoding: 'utf8',
    },
  );
  return JSON.parse(output.trim().split('\n').pop()!) as Record<string, unknown>;
}

describe('outbox message rules: class-validator on first use', () => {
  it('importing the library loads neither class-validator nor class-transformer; validating a message loads both and attaches the rules to the exported classes', () => {
    const result = inFreshProcess(`
      const loaded = () => ({
        validator: Object.keys(require.cache).some((k) => k.includes('/node_modules/class-validator/')),
        transformer: Object.keys(require.cache).some((k) => k.includes('/node_modules/class-transformer/')),
      });
      const lib = require('./libs/sequence/src/index.ts');
      const atImport = loaded();
      let refused = [];
      try {
        lib.OutboxService; // nothing validated yet
        require('./libs/sequence/src/outbox/outbox-message.codec.ts').toEvent({
          type: '1bad', aggregateType: 'Order', aggregateId: 7, payload: {},
        });
      } catch (error) {
        refused = error.problems;
      }
      const afterFirstMessage = loaded();
      // The exported class now carries the rules for the application's own validation too.
      const { validateSync } = require('class-validator');
      const own = validateSync(Object.assign(new lib.OutboxCommand(), {
        id: 'c-1', type: 'ArchiveTask', targetService: 'no spaces allowed', payload: 1,
      }));
      console.log(JSON.stringify({
        atImport, afterFirstMessage, refused,
        own: own.map((error) => error.property),
      }));
    `);
    expect(result.atImport).toEqual({ validator: false, transformer: false });
    expect(result.afterFirstMessage).toEqual({ validator: true, transformer: true });
    expect(result.refused).toEqual([
      'type must start with a letter and hold only letters, digits and _ . : -',
    ]);
    expect(result.own).toEqual(['targetService']);
  });
});
