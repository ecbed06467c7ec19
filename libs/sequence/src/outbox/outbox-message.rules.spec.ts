import { execFileSync } from 'node:child_process';
import { join, resolve } from 'node:path';

const ROOT = resolve(__dirname, '../../../..');

/**
 * Runs `script` in a fresh Node process with the library's sources loaded through ts-node (Jest's
 * own module registry would hide what Node itself loads) and returns its last line, as JSON.
 */
function inFreshProcess(script: string): Record<string, unknown> {
  const output = execFileSync(
    process.execPath,
    ['-r', 'ts-node/register/transpile-only', '-r', 'tsconfig-paths/register', '-e', script],
    {
      cwd: ROOT,
      env: { ...process.env, TS_NODE_PROJECT: join(ROOT, 'tsconfig.json') },
      encoding: 'utf8',
      timeout: 50_000,
    },
  );
  return JSON.parse(output.trim().split('\n').pop()!) as Record<string, unknown>;
}

/** Script lines: `loaded()` tells whether Node has loaded class-validator / class-transformer. */
const LOADED = `
  const inCache = (name) => Object.keys(require.cache)
    .some((file) => file.replace(/\\\\/g, '/').includes('/node_modules/' + name + '/'));
  const loaded = () => ({ validator: inCache('class-validator'), transformer: inCache('class-transformer') });
`;

/** Script lines: `ownCheck()` validates a bad command with class-validator, as an app would. */
const OWN_CHECK = `
  const ownCheck = (lib) => require('class-validator')
    .validateSync(Object.assign(new lib.OutboxCommand(), {
      id: 'c-1', type: 'ArchiveTask', targetService: 'no spaces allowed', payload: 1,
    }))
    .map((error) => error.property);
`;

describe('outbox message rules: class-validator on first use', () => {
  it('importing the library loads neither class-validator nor class-transformer; the first message validated loads both and attaches the rules', () => {
    const result = inFreshProcess(`
      ${LOADED}
      ${OWN_CHECK}
      const lib = require('./libs/sequence/src/index.ts');
      const atImport = loaded();
      const { toEvent } = require('./libs/sequence/src/outbox/outbox-message.codec.ts');
      const refusals = [];
      for (let i = 0; i < 2; i++) {
        try {
          toEvent({ type: '1bad', aggregateType: 'Order', aggregateId: 7, payload: {} });
        } catch (error) {
          if (!(error instanceof lib.InvalidOutboxMessageError)) throw error;
          refusals.push(error.problems);
        }
      }
      console.log(JSON.stringify({ atImport, afterFirstMessage: loaded(), refusals, own: ownCheck(lib) }));
    `);
    expect(result.atImport).toEqual({ validator: false, transformer: false });
    expect(result.afterFirstMessage).toEqual({ validator: true, transformer: true });
    const problem = 'type must start with a letter and hold only letters, digits and _ . : -';
    expect(result.refusals).toEqual([[problem], [problem]]);
    // The exported class carries the rules for the application's own validation too.
    expect(result.own).toEqual(['targetService']);
  });

  it('attachOutboxMessageRules() attaches them before any message, for an application validating the classes itself; once, however often the rules are asked for', () => {
    const result = inFreshProcess(`
      ${LOADED}
      ${OWN_CHECK}
      const lib = require('./libs/sequence/src/index.ts');
      const wire = require('./libs/sequence/src/wire.ts');
      const rulesOf = (type) => require('class-validator').getMetadataStorage()
        .getTargetValidationMetadatas(type, '', true, false).length;
      wire.attachOutboxMessageRules();
      const once = [rulesOf(lib.OutboxEvent), rulesOf(lib.OutboxCommand)];
      wire.attachOutboxMessageRules();
      lib.OutboxService; // and a message validated since
      require('./libs/sequence/src/outbox/outbox-message.codec.ts')
        .toCommand({ type: 'ArchiveTask', targetService: 'tasks', payload: 1 });
      const again = [rulesOf(lib.OutboxEvent), rulesOf(lib.OutboxCommand)];
      console.log(JSON.stringify({ loaded: loaded(), own: ownCheck(lib), once, again }));
    `);
    expect(result.loaded).toEqual({ validator: true, transformer: true });
    expect(result.own).toEqual(['targetService']);
    // id and type: 2 rules each; an event adds 2 + 2 + 1 + 1 + 3, a command 2 + 3 + 1.
    expect(result.once).toEqual([13, 10]);
    expect(result.again).toEqual(result.once);
  });
});
