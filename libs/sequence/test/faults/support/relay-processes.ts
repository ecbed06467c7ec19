import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OutboxRelayProcess } from '../../support/processes/outbox-relay-process';
import type { PostgresOutboxApp } from './outbox-app';
import { useOutboxServers, type OutboxServers } from './outbox-servers';

/** What {@link useRelayProcesses} gives a test: its servers, and what it starts, cleaned up after it. */
export interface RelayProcessTest {
  readonly servers: OutboxServers;
  /** Relay processes the test started: killed after it. */
  readonly processes: OutboxRelayProcess[];
  /** Apps the test created: closed after it. */
  readonly apps: PostgresOutboxApp[];
  /** A fresh directory for the test's results files, removed after it. */
  dir(): string;
}

/**
 * Registers, in the calling describe block, the hooks of a test with relay processes:
 * {@link useOutboxServers}, whose cleanup first kills the test's relay processes and closes its
 * apps, and a temporary directory per test (named after `dirPrefix`).
 */
export function useRelayProcesses(dirPrefix: string): RelayProcessTest {
  const processes: OutboxRelayProcess[] = [];
  const apps: PostgresOutboxApp[] = [];
  const servers = useOutboxServers({
    beforeCleanup: async () => {
      for (const relay of processes.splice(0)) await relay.kill();
      for (const app of apps.splice(0)) await app.close();
    },
  });
  let dir: string | undefined;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), dirPrefix));
  });
  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = undefined;
  });
  return {
    servers,
    processes,
    apps,
    dir: () => {
      if (!dir) throw new Error('useRelayProcesses: no directory outside a test');
      return dir;
    },
  };
}
