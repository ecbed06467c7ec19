import { join } from 'node:path';
import * as ts from 'typescript';
import {
  CHECK_IN_KEYS,
  checkKeys,
  CLAIM_CHECK_HANDLER_KEYS,
  CLAIM_CHECK_HANDLER_RENAMES,
  CLAIM_PUBLISH_KEYS,
  CLAIM_PUBLISH_RENAMES,
  CONSUMER_RENAMES,
  INBOX_HANDLER_KEYS,
  MODULE_KEYS,
  MODULE_RENAMES,
  RESEQUENCER_DEFINITION_KEYS,
  SEND_KEYS,
  SEND_RENAMES,
  SEQUENCE_ADMIN_KEYS,
  SEQUENCE_CONSUMER_KEYS,
  SEQUENCED_HANDLER_KEYS,
  SEQUENCE_CLIENT_KEYS,
  SEQUENCE_SERVER_KEYS,
  type KeyTree,
  type Renames,
} from './option-keys';

const SRC = join(__dirname, '..');
const ROOT = join(SRC, '../../..');

/** Each key tree, the type it must equal, and the renames that go with it. */
const TREES: ReadonlyArray<{ type: string; keys: KeyTree; renames?: Renames }> = [
  { type: 'SequenceModuleOptions', keys: MODULE_KEYS, renames: MODULE_RENAMES },
  { type: 'SequencedHandlerOptions', keys: SEQUENCED_HANDLER_KEYS, renames: CONSUMER_RENAMES },
  { type: 'SequenceConsumerOptions', keys: SEQUENCE_CONSUMER_KEYS, renames: CONSUMER_RENAMES },
  {
    type: 'ClaimCheckHandlerOptions',
    keys: CLAIM_CHECK_HANDLER_KEYS,
    renames: CLAIM_CHECK_HANDLER_RENAMES,
  },
  { type: 'ResequencerDefinition', keys: RESEQUENCER_DEFINITION_KEYS },
  { type: 'InboxHandlerOptions', keys: INBOX_HANDLER_KEYS },
  { type: 'SendOptions', keys: SEND_KEYS, renames: SEND_RENAMES },
  { type: 'CheckInOptions', keys: CHECK_IN_KEYS },
  { type: 'ClaimPublishOptions', keys: CLAIM_PUBLISH_KEYS, renames: CLAIM_PUBLISH_RENAMES },
  { type: 'SequenceServerOptions', keys: SEQUENCE_SERVER_KEYS },
  { type: 'SequenceClientOptions', keys: SEQUENCE_CLIENT_KEYS },
  { type: 'SequenceAdminOptions', keys: SEQUENCE_ADMIN_KEYS },
];

/**
 * The key tree of a type, as the checker sees it: a property whose type is one of the library's
 * own option shapes (an interface or type literal outside `ports/` and `core/`, `false` allowed
 * beside it) is a subtree; anything else (a value, a union of words and objects, a function, a
 * port, an adapter) is a leaf.
 */
function treeOf(checker: ts.TypeChecker, type: ts.Type, depth = 0): KeyTree {
  const tree: Record<string, KeyTree | true> = {};
  for (const property of checker.getPropertiesOfType(type)) {
    const declaration = property.valueDeclaration ?? property.declarations![0];
    const propertyType = checker.getNonNullableType(
      checker.getTypeOfSymbolAtLocation(property, declaration),
    );
    const members = (propertyType.isUnion() ? propertyType.types : [propertyType]).filter(
      (member) => !(member.flags & ts.TypeFlags.BooleanLiteral),
    );
    const shapes =
      members.length > 0 && members.every((member) => isOptionShape(checker, member)) && depth < 6;
    tree[property.name] = shapes
      ? Object.assign({}, ...members.map((member) => treeOf(checker, member, depth + 1)))
      : true;
  }
  return tree;
}

function isOptionShape(checker: ts.TypeChecker, type: ts.Type): boolean {
  if (!(type.flags & ts.TypeFlags.Object) || checker.getSignaturesOfType(type, 0).length > 0) {
    return false;
  }
  const declaration = (type.aliasSymbol ?? type.getSymbol())?.declarations?.[0];
  if (!declaration) return false;
  const file = declaration.getSourceFile().fileName;
  const own =
    file.startsWith(SRC) &&
    !file.includes('/ports/') &&
    !file.includes('/core/') &&
    !file.includes('node_modules');
  return own && (ts.isInterfaceDeclaration(declaration) || ts.isTypeLiteralNode(declaration));
}

function typesByName(): Map<string, { checker: ts.TypeChecker; type: ts.Type }> {
  const config = ts.readConfigFile(join(ROOT, 'tsconfig.json'), (path) => ts.sys.readFile(path));
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, ROOT);
  const files = [
    'options/module-options.ts',
    'discovery/sequenced-handler.decorator.ts',
    'discovery/claim-check.decorator.ts',
    'discovery/inbox-handler.decorator.ts',
    'sequence/splitter.types.ts',
    'claim-check/claim-check.service.ts',
    'microservices/sequence.server.ts',
    'microservices/sequence.client.ts',
    'admin/admin.options.ts',
  ].map((file) => join(SRC, file));
  const program = ts.createProgram(files, { ...parsed.options, noEmit: true });
  const checker = program.getTypeChecker();
  const found = new Map<string, { checker: ts.TypeChecker; type: ts.Type }>();
  const wanted = new Set(TREES.map(({ type }) => type));
  for (const file of program.getSourceFiles()) {
    if (!file.fileName.startsWith(SRC)) continue;
    for (const statement of file.statements) {
      if (
        (ts.isInterfaceDeclaration(statement) || ts.isTypeAliasDeclaration(statement)) &&
        wanted.has(statement.name.text)
      ) {
        found.set(statement.name.text, {
          checker,
          type: checker.getTypeAtLocation(statement.name),
        });
      }
    }
  }
  return found;
}

/** The paths of a tree, leaves and subtrees alike. */
function pathsOf(tree: KeyTree, at = ''): string[] {
  return Object.entries(tree).flatMap(([key, value]) => {
    const path = at ? `${at}.${key}` : key;
    return value === true ? [path] : [path, ...pathsOf(value, path)];
  });
}

describe('the option key trees', () => {
  const types = typesByName();

  describe.each(TREES)('$type', ({ type, keys, renames = {} }) => {
    it('has exactly the keys of its type, nested as the type nests them', () => {
      const found = types.get(type);
      expect(found).toBeDefined();
      expect(keys).toEqual(treeOf(found!.checker, found!.type));
    });

    it('names no current option as renamed, and points renames at options that exist', () => {
      const paths = new Set(pathsOf(keys));
      for (const [old, now] of Object.entries(renames)) {
        expect(paths.has(old)).toBe(false);
        for (const [, named] of now.matchAll(/`([A-Za-z.]+\.[A-Za-z.]+)`/g)) {
          expect({ old, named, exists: paths.has(named) }).toEqual({ old, named, exists: true });
        }
      }
    });
  });
});

describe('checkKeys', () => {
  const problemsOf = (value: unknown, keys: KeyTree, renames?: Renames) => {
    const problems: string[] = [];
    checkKeys(problems, value, keys, renames);
    return problems;
  };

  it('says what replaced a renamed option, at any depth', () => {
    expect(
      problemsOf(
        {
          store: {},
          publish: { attempts: 3 },
          claimCheck: { threshold: 1 },
          outbox: { inboxEvents: { maxAttempts: 2 } },
        },
        MODULE_KEYS,
        MODULE_RENAMES,
      ),
    ).toEqual([
      'store is no longer an option: use `sequence.store` (or `stores`, e.g. redis(url) of nest-sequence/redis)',
      'publish.attempts is no longer an option: use `publish.retry.attempts`',
      'claimCheck.threshold is no longer an option: use `claimCheck.inlineMaxBytes`',
      'outbox.inboxEvents.maxAttempts is no longer an option: use `outbox.inboxEvents.retry.attempts`',
    ]);
  });

  it('lists the keys there are for a key it does not know', () => {
    expect(problemsOf({ publish: { retry: { attemps: 3 } } }, MODULE_KEYS)).toEqual([
      'publish.retry.attemps is not an option; publish.retry takes attempts, baseDelayMs, maxDelayMs',
    ]);
    expect(problemsOf({ prefech: 3 }, SEND_KEYS)).toEqual([
      'prefech is not an option; the options are sequenceId, fragmentBytes, headers, ' +
        'contentType, contentEncoding, publish, via, buffer, partitions',
    ]);
  });

  it('leaves values of options (a store instance, a list of stores) to their own checks', () => {
    class Store {
      readonly whatever = 1;
    }
    expect(
      problemsOf(
        { sequence: { store: new Store() }, stores: [{ any: 1 }], metrics: false, tracing: false },
        MODULE_KEYS,
      ),
    ).toEqual([]);
  });

  it('refuses a group of options given as anything but an object, rather than its defaults', () => {
    expect(
      problemsOf(
        {
          tuning: 'x',
          publish: 5000,
          sequence: { spool: '/data/spool' },
          outbox: { outboxEvents: null },
        },
        MODULE_KEYS,
      ),
    ).toEqual([
      'tuning must be an object of options (headerAllowanceBytes, backpressureDelayMs, leaseMs, storeTimeoutMs, maxStoreRequeues, drain, sweepers), got "x"',
      'publish must be an object of options (confirmTimeoutMs, retry, inFlight), got 5000',
      'sequence.spool must be an object of options (dir, maxBytes), got "/data/spool"',
      expect.stringMatching(/^outbox\.outboxEvents must be an object of options \(.*\), got null$/),
    ]);
    expect(problemsOf({ tuning: { sweepers: { expiry: false } } }, MODULE_KEYS)).toEqual([
      'tuning.sweepers.expiry must be an object of options (intervalMs, batchSize), got false',
    ]);
  });

  it('leaves the keys of options given as a class instance to the resolvers', () => {
    // A config class may hold an injected service and give its options through getters.
    class Config {
      constructor(readonly config: { get(key: string): unknown }) {}
      get handlerTimeoutMs(): number {
        return 5_000;
      }
    }
    expect(problemsOf(new Config({ get: () => undefined }), MODULE_KEYS)).toEqual([]);
  });
});
