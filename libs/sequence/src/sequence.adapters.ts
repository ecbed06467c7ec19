import { EncryptingPayloadStore } from './adapters/payload/encrypting/encrypting.payload-store';
import { FilesystemPayloadStore } from './adapters/payload/filesystem/filesystem.payload-store';
import { MemoryClaimLedger } from './adapters/stores/memory/memory.claim-ledger';
import { MemoryResequencerStore } from './adapters/stores/memory/memory.resequencer-store';
import { MemorySequenceStore } from './adapters/stores/memory/memory.sequence-store';
import { Logger } from '@nestjs/common';
import { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
import { settlesWithin } from './core/async';
import { errorMessage } from './core/errors/caught';
import { SequenceOptionsError } from './core/errors/sequence-options.error';
import { kindOf } from './core/option-keys';
import type { LifecyclePart } from './kernel/sequence.lifecycle';
import type { ClaimCheckStores, OutboxStoreSource } from './kernel/tokens';
import type { SequenceModuleOptions } from './options/module-options';
import { payloadStoreProblems } from './options/resolve-claim-check';
import type { PayloadStore } from './ports/payload-store.port';
import type { ResequencerStore } from './ports/resequencer-store.port';
import type { SequenceStore } from './ports/sequence-store.port';
import type { StoreSet } from './ports/store-set.port';
import type { Transport } from './ports/transport.port';

/** Something the module opened and closes at shutdown. */
interface Closeable {
  close(): Promise<void>;
}

/** The adapters the module runs on: the options' own, a `stores` set's, or the embedded defaults. */
export interface ModuleAdapters {
  readonly transport: Transport;
  readonly sequenceStore: SequenceStore;
  readonly resequencerStore: ResequencerStore;
  readonly claimCheck: ClaimCheckStores;
  readonly outbox: OutboxStoreSource;
  /** What the module opened (defaults) or took over (`stores` sets), closed at shutdown in order. */
  readonly owned: readonly Closeable[];
}

/**
 * The lifecycle part that closes what the module owns (`ModuleAdapters.owned`), in order, last
 * at shutdown and also when the module's own start fails at bootstrap (Nest then runs no shutdown
 * hook, and a `stores` set's connection would keep the process alive). One failing to close is
 * logged and does not keep the others open; nor does one that has not closed after `closeMs`
 * (a server that stopped answering: its close may still end later).
 */
export class OwnedAdapters implements LifecyclePart {
  private readonly logger = new Logger('SequenceModule');

  constructor(
    private readonly owned: readonly Closeable[],
    /** How long one adapter's close is waited for: `shutdownTimeoutMs`, at least a second. */
    private readonly closeMs: number,
  ) {}

  async close(): Promise<void> {
    for (const adapter of this.owned) {
      const closing = (async () => adapter.close())();
      try {
        if (!(await settlesWithin(closing, this.closeMs))) {
          this.logger.warn(
            `closing ${adapterName(adapter)} did not finish within ${this.closeMs} ms ` +
              '(shutdownTimeoutMs, at least 1000): a server that stopped answering? Shutdown goes ' +
              'on without it',
          );
          continue;
        }
        await closing;
      } catch (error) {
        this.logger.warn(`closing ${adapterName(adapter)} failed: ${errorMessage(error)}`);
      }
    }
  }
}

/** An owned adapter in a log line: its class, or the name of a `stores` set (a plain object). */
function adapterName(adapter: object): string {
  const name = (adapter as { name?: unknown }).name;
  return adapter.constructor === Object || adapter.constructor === undefined
    ? `the store set ${String(name)}`
    : adapter.constructor.name;
}

/**
 * Picks every adapter, the composition root's one job: a pattern's own option first, then the
 * first `stores` set that has one, then the embedded default (which the module then owns).
 * Problems (payload store names, encryption keys) are added to `problems`; the caller throws.
 */
export function composeAdapters(
  options: SequenceModuleOptions,
  problems: string[],
): ModuleAdapters {
  const sets: readonly StoreSet[] =
    options.stores === undefined
      ? []
      : Array.isArray(options.stores)
        ? (options.stores as readonly StoreSet[])
        : [options.stores as StoreSet];
  for (const [index, set] of sets.entries()) {
    if (typeof set !== 'object' || set === null || typeof set.close !== 'function') {
      problems.push(
        `stores${sets.length > 1 ? `[${index}]` : ''} must be a store set from a preset ` +
          '(redis() of nest-sequence/redis, postgres() of nest-sequence/postgres)',
      );
    }
  }
  for (const [path, adapter, port, methods] of [
    ['transport', options.transport, 'Transport', ['publish', 'subscribe', 'close']],
    ['sequence.store', options.sequence?.store, 'SequenceStore', ['accept', 'finish', 'close']],
    [
      'resequencer.store',
      options.resequencer?.store,
      'ResequencerStore',
      ['accept', 'claimDrain', 'close'],
    ],
    ['claimCheck.store', options.claimCheck?.store, 'PayloadStore', ['put', 'get', 'close']],
    [
      'claimCheck.ledger',
      options.claimCheck?.ledger,
      'ClaimLedger',
      ['claim', 'complete', 'close'],
    ],
    ['outbox.store', options.outbox?.store, 'OutboxStore', ['append', 'claim', 'close']],
  ] as const) {
    const problem = adapterProblem(path, adapter, port, methods);
    if (problem) problems.push(problem);
  }
  const fromSets = <K extends keyof StoreSet>(key: K): StoreSet[K] | undefined =>
    sets.find((set) => set?.[key] !== undefined)?.[key];

  // Defaults first in the list: the module closes the transport before the stores.
  const owned: Closeable[] = [];
  const own = <T extends Closeable>(adapter: T): T => {
    owned.push(adapter);
    return adapter;
  };
  const closeTransport = options.closeTransport ?? false;
  if (typeof closeTransport !== 'boolean') {
    problems.push(`closeTransport must be true or false, got ${JSON.stringify(closeTransport)}`);
  }
  const given = options.transport;
  const transport =
    given === undefined
      ? own(new InMemoryTransport())
      : closeTransport === true
        ? own(given)
        : given;
  const sequenceEncryption = options.sequence?.encryption;
  const givenSequenceStore = options.sequence?.store ?? fromSets('sequenceStore');
  if (givenSequenceStore && sequenceEncryption) problems.push(encryptionOfGivenStore('sequence'));
  const sequenceStore =
    givenSequenceStore ??
    own(
      encryptedDefault(
        'sequence',
        () => new MemorySequenceStore({ encryption: sequenceEncryption }),
        () => new MemorySequenceStore(),
        problems,
      ),
    );
  const resequencerEncryption = options.resequencer?.encryption;
  const givenResequencerStore = options.resequencer?.store ?? fromSets('resequencerStore');
  if (givenResequencerStore && resequencerEncryption) {
    problems.push(encryptionOfGivenStore('resequencer'));
  }
  const resequencerStore =
    givenResequencerStore ??
    own(
      encryptedDefault(
        'resequencer',
        () => new MemoryResequencerStore({ encryption: resequencerEncryption }),
        () => new MemoryResequencerStore(),
        problems,
      ),
    );
  const claimCheck = claimCheckStores(options, fromSets, own, problems);
  const outboxStore = options.outbox?.store ?? fromSets('outboxStore');
  owned.push(...sets.filter((set) => typeof set?.close === 'function'));
  return {
    transport,
    sequenceStore,
    resequencerStore,
    claimCheck,
    outbox: { store: outboxStore, openEmbedded: openEmbeddedOutboxStore },
    owned,
  };
}

/**
 * A default store built with the module's `<pattern>.encryption` keys; on bad keys, their
 * problems (the caller throws) and a plain store in the meantime.
 */
function encryptedDefault<T>(
  pattern: 'sequence' | 'resequencer',
  encrypted: () => T,
  plain: () => T,
  problems: string[],
): T {
  try {
    return encrypted();
  } catch (error) {
    if (!(error instanceof SequenceOptionsError)) throw error;
    problems.push(...error.problems.map((problem) => `${pattern}.encryption: ${problem}`));
    return plain();
  }
}

function encryptionOfGivenStore(pattern: 'sequence' | 'resequencer'): string {
  return (
    `${pattern}.encryption configures the default ${pattern} store only, and a store is given ` +
    `(${pattern}.store or stores): give the keys to that store instead, e.g. ` +
    'redis(url, { encryption: { keys } }), and remove them here'
  );
}

/**
 * What is wrong with an adapter given as `path`, or undefined: it must have the port's methods (a
 * store set from a preset, say, goes under `stores`).
 */
function adapterProblem(
  path: string,
  adapter: unknown,
  port: string,
  methods: readonly string[],
): string | undefined {
  if (adapter === undefined) return undefined;
  const missing =
    typeof adapter === 'object' && adapter !== null
      ? methods.filter(
          (method) => typeof (adapter as Record<string, unknown>)[method] !== 'function',
        )
      : methods;
  if (missing.length === 0) return undefined;
  const storeSet =
    typeof adapter === 'object' &&
    adapter !== null &&
    ['sequenceStore', 'resequencerStore', 'payloadStore', 'claimLedger', 'outboxStore'].some(
      (key) => key in adapter,
    );
  return storeSet
    ? `${path} is given a store set (from a preset such as redis()); pass it as \`stores\` instead`
    : `${path} must be ${/^[AEIOU]/.test(port) ? 'an' : 'a'} ${port} (it has no ${missing.join(', ')}); ` +
        'see nest-sequence/ports';
}

/** `claimCheck.readStores`, or what is wrong with it (past the types: a factory, plain JS). */
function readStoresOf(given: unknown): { stores?: PayloadStore[]; problems?: string[] } {
  if (given === undefined) return {};
  if (!Array.isArray(given)) {
    return {
      problems: [`claimCheck.readStores must be an array of PayloadStores, got ${kindOf(given)}`],
    };
  }
  // Array.from: a hole (`[, store]`) is an entry too, which flatMap would skip.
  const problems = Array.from(given as unknown[]).flatMap((candidate: unknown, index) => {
    const path = `claimCheck.readStores[${index}]`;
    if (candidate === undefined) return [`${path} must be a PayloadStore, got undefined`];
    return adapterProblem(path, candidate, 'PayloadStore', ['put', 'get', 'close']) ?? [];
  });
  return problems.length > 0 ? { problems } : { stores: given as PayloadStore[] };
}

function claimCheckStores(
  options: SequenceModuleOptions,
  fromSets: <K extends keyof StoreSet>(key: K) => StoreSet[K] | undefined,
  own: <T extends Closeable>(adapter: T) => T,
  problems: string[],
): ClaimCheckStores {
  const given = options.claimCheck ?? {};
  const store: PayloadStore =
    given.store ?? fromSets('payloadStore') ?? own(new FilesystemPayloadStore());
  const ledger = given.ledger ?? fromSets('claimLedger') ?? own(new MemoryClaimLedger());
  const readStores = readStoresOf(given.readStores);
  const candidates = [store, ...(readStores.stores ?? [])];
  const storeProblems = readStores.problems ?? payloadStoreProblems(candidates);
  problems.push(...storeProblems);
  const stores = new Map<string, PayloadStore>();
  if (storeProblems.length > 0) return { store, stores, ledger };
  for (const candidate of candidates) {
    try {
      stores.set(
        candidate.name,
        given.encryption ? new EncryptingPayloadStore(candidate, given.encryption) : candidate,
      );
    } catch (error) {
      if (!(error instanceof SequenceOptionsError)) throw error;
      problems.push(...error.problems.map((problem) => `claimCheck.encryption: ${problem}`));
      break;
    }
  }
  return { store: stores.get(store.name) ?? store, stores, ledger };
}

/**
 * The outbox's embedded default: an in-memory SQLite database, loaded only when used, so that an
 * application with an outbox store of its own (or no outbox) needs no better-sqlite3.
 */
async function openEmbeddedOutboxStore(): ReturnType<OutboxStoreSource['openEmbedded']> {
  let sqlite: typeof import('./adapters/stores/sqlite/sqlite.outbox-store');
  try {
    sqlite = await import('./adapters/stores/sqlite/sqlite.outbox-store');
  } catch (error) {
    if (!isMissingModule(error, 'better-sqlite3')) throw error;
    throw new SequenceOptionsError('SequenceModule outbox options', [
      'the outbox runs on an embedded SQLite database unless outbox.store is given, and ' +
        'better-sqlite3 is not installed: `npm install better-sqlite3@12`, or give ' +
        'outbox.store a PostgresOutboxStore (nest-sequence/postgres)',
    ]);
  }
  return sqlite.SqliteOutboxStore.open({ filename: ':memory:' });
}

/** Whether `error` is Node's failure to find the package `name` (not one of its own imports failing). */
function isMissingModule(error: unknown, name: string): boolean {
  return (
    (error as { code?: unknown } | null)?.code === 'MODULE_NOT_FOUND' &&
    String((error as Error).message).includes(`'${name}'`)
  );
}
