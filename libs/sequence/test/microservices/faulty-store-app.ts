import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FilesystemPayloadStore } from 'nest-sequence';
import { SettlementRecordingTransport } from '../claim-check/claim-check-test-app';
import { FaultInjectingPayloadStore } from '../claim-check/fault-injecting.payload-store';
import { CountedReplies } from './counted-replies.transport';
import {
  createMicroserviceTestApp,
  type MicroserviceTestApp,
  type MicroserviceTestAppOptions,
} from './microservice-test-app';

export interface FaultyStoreApp {
  /** The in-memory transport, recording how each message was settled. */
  readonly inner: SettlementRecordingTransport;
  /** `inner`, counting the replies published: the app's transport. */
  readonly transport: CountedReplies;
  /** A filesystem payload store under a temporary directory, failing on demand. */
  readonly store: FaultInjectingPayloadStore;
  readonly app: MicroserviceTestApp;
}

/**
 * A microservice app of the suite, started before its tests and closed after them (its
 * directory removed), over `transport` and a payload store that fails when told: `options`
 * builds the app's options from them.
 */
export function useFaultyStoreApp(
  directoryPrefix: string,
  options: (parts: {
    transport: CountedReplies;
    store: FaultInjectingPayloadStore;
  }) => MicroserviceTestAppOptions,
): FaultyStoreApp {
  const inner = new SettlementRecordingTransport();
  const transport = new CountedReplies(inner);
  let dir: string | undefined;
  let store: FaultInjectingPayloadStore | undefined;
  let app: MicroserviceTestApp | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), directoryPrefix));
    store = new FaultInjectingPayloadStore(new FilesystemPayloadStore({ root: dir }));
    app = await createMicroserviceTestApp(options({ transport, store }));
  });
  afterAll(async () => {
    await app?.close();
    await inner.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const started = <T>(value: T | undefined): T => {
    if (value === undefined) throw new Error('the app starts in beforeAll');
    return value;
  };
  return {
    inner,
    transport,
    get store() {
      return started(store);
    },
    get app() {
      return started(app);
    },
  };
}
