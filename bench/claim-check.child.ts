/**
 * A child process of the Claim Check benchmark, forked by claim-check.bench.ts (as plain
 * JavaScript, see plain-js-build.ts) so that its peak RSS and CPU are its own role's. Its only
 * argument is a JSON {@link ChildConfig}; it talks to the parent over IPC ({@link ToChild},
 * {@link FromChild}).
 *
 * The baseline roles (writer, reader: claim-check.baseline.ts) load nothing but Node's own
 * modules; the module roles (sender: claim-check.module-sender.ts, receiver:
 * claim-check.module-receiver.ts) are Nest applications, loaded only in their own processes.
 */
import { constants, PerformanceObserver, type PerformanceEntry } from 'node:perf_hooks';
import { ownCpuSeconds, PeakMemory } from './process-probe';
import {
  epochMs,
  type ChildConfig,
  type EpochMs,
  type FromChild,
  type ToChild,
} from './claim-check.protocol';

const config = JSON.parse(process.argv[2] ?? '{}') as ChildConfig;
const memory = new PeakMemory(config.rssSampleMs);

function send(message: FromChild): void {
  process.send?.(message);
}

const GC_KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'markCompact',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incrementalMarking',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakCallbacks',
};

/** Garbage collections (pauses on the main thread) since the last `reset`, by kind. */
let gc: Record<string, { count: number; ms: number }> = {};
new PerformanceObserver((list) => {
  for (const entry of list.getEntries() as Array<
    PerformanceEntry & { detail?: { kind: number } }
  >) {
    const kind = GC_KINDS[entry.detail?.kind ?? -1] ?? 'other';
    const tally = (gc[kind] ??= { count: 0, ms: 0 });
    tally.count++;
    tally.ms = Math.round((tally.ms + entry.duration) * 10) / 10;
  }
}).observe({ entryTypes: ['gc'] });

/** One run of this child: from `arm` to `settled`. */
export class Run {
  private readonly cpuAtStart = ownCpuSeconds();
  private readonly faultsAtStart = process.resourceUsage().minorPageFault;
  private readonly marks: Record<string, EpochMs> = {};
  private settled = false;
  /** Chunks the reading side received. */
  chunks?: number;

  constructor(
    readonly id: string,
    readonly bytes: number,
  ) {
    memory.reset();
    gc = {};
  }

  /** Notes when `name` first happened in this run. */
  mark(name: string): void {
    this.marks[name] ??= epochMs();
  }

  /** writer, sender: every byte is stored. */
  stored(bytes: number, sha256: string, ref: string): void {
    send({ type: 'stored', run: this.id, bytes, sha256, ref });
  }

  /** reader, receiver: every byte was read and verified (the clock stops). */
  done(bytes: number): void {
    send({ type: 'done', run: this.id, bytes });
  }

  /** This child's part of the run is over: its figures, once. */
  settle(): void {
    if (this.settled) return;
    this.settled = true;
    send({
      type: 'settled',
      run: this.id,
      figures: {
        ...memory.read(),
        cpuSeconds: Math.round((ownCpuSeconds() - this.cpuAtStart) * 100) / 100,
        marks: { ...this.marks },
        chunks: this.chunks,
        minorFaults: process.resourceUsage().minorPageFault - this.faultsAtStart,
        gc,
      },
    });
  }
}

/** What a role gives the child: a way to carry out the parent's commands, and to stop. */
export interface Role {
  /** Carries out `write`, `send` or `read` (whichever the role takes) for `run`. */
  handle(message: Exclude<ToChild, { type: 'arm' | 'stop' }>, run: Run): Promise<void>;
  stop(): Promise<void>;
}

/** What a role may call back: the current run, and a fatal failure. */
export interface RoleContext {
  currentRun(): Run | undefined;
  fail(error: unknown): void;
}

let run: Run | undefined;

async function startRole(context: RoleContext): Promise<Role> {
  switch (config.role) {
    case 'writer':
      return (await import('./claim-check.baseline')).startWriter(config);
    case 'reader':
      return (await import('./claim-check.baseline')).startReader();
    case 'sender':
      return (await import('./claim-check.module-sender')).startSender(config, context);
    case 'receiver':
      return (await import('./claim-check.module-receiver')).startReceiver(config, context);
    default:
      throw new Error(`unknown role ${String(config.role)}`);
  }
}

async function main(): Promise<void> {
  // The parent is gone (crashed or killed): nothing left to report to.
  process.on('disconnect', () => process.exit(2));
  const role = await startRole({ currentRun: () => run, fail });
  process.on('message', (message: ToChild) => {
    if (message.type === 'arm') {
      run = new Run(message.run, message.bytes);
      send({ type: 'armed', run: message.run });
    } else if (message.type === 'stop') {
      memory.stop();
      role.stop().then(
        () => process.exit(0),
        (error: unknown) => fail(error),
      );
    } else {
      const current = run;
      if (current?.id !== message.run) {
        fail(new Error(`${message.type} for run ${message.run}, which was not armed`));
        return;
      }
      role.handle(message, current).catch(fail);
    }
  });
  send({
    type: 'ready',
    pid: process.pid,
    idleRssMiB: Math.round((process.memoryUsage.rss() / 1024 / 1024) * 10) / 10,
  });
}

function fail(error: unknown): void {
  const message = error instanceof Error ? (error.stack ?? error.message) : String(error);
  send({ type: 'error', message: `${config.role}: ${message}` });
  // Let the IPC message go, then go.
  setTimeout(() => process.exit(1), 100).unref();
}

process.on('uncaughtException', fail);
process.on('unhandledRejection', fail);
main().catch(fail);
