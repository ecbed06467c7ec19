/**
 * A child process of the Claim Check benchmark, forked by claim-check.bench.ts (as plain
 * JavaScript, see harness/plain-js-build.ts) so that its peak RSS and CPU are its own role's. Its
 * only argument is a JSON {@link ChildConfig}; it talks to the parent over IPC ({@link ToChild},
 * {@link FromChild}, harness/child-main.ts).
 *
 * The baseline roles (writer, reader: claim-check.baseline.ts) load nothing but Node's own
 * modules; the module roles (sender: claim-check.module-sender.ts, receiver:
 * claim-check.module-receiver.ts) are Nest applications, loaded only in their own processes.
 */
import { childConfig, runChild, type ParentLink } from './harness/child-main';
import { ownCpuSeconds } from './harness/cpu';
import { epochMs, GcPauses, PeakMemory, type EpochMs } from './harness/measure';
import type { ChildConfig, FromChild, ToChild } from './claim-check.protocol';

const config = childConfig<ChildConfig>();
const memory = new PeakMemory(config.rssSampleMs);
const gc = new GcPauses();

/** One run of this child: from `arm` to `settled`. */
export class Run {
  private readonly cpuAtStart = ownCpuSeconds();
  private readonly faultsAtStart = process.resourceUsage().minorPageFault;
  private readonly marks: Record<string, EpochMs> = {};
  private settled = false;
  /** Chunks the reading side received. */
  chunks?: number;

  constructor(
    private readonly parent: ParentLink<FromChild>,
    readonly id: string,
    readonly bytes: number,
  ) {
    memory.reset();
    gc.reset();
  }

  /** Notes when `name` first happened in this run. */
  mark(name: string): void {
    this.marks[name] ??= epochMs();
  }

  /** writer, sender: every byte is stored. */
  stored(bytes: number, sha256: string, ref: string): void {
    this.parent.send({ type: 'stored', run: this.id, bytes, sha256, ref });
  }

  /** reader, receiver: every byte was read and verified (the clock stops). */
  done(bytes: number): void {
    this.parent.send({ type: 'done', run: this.id, bytes });
  }

  /** This child's part of the run is over: its figures, once. */
  settle(): void {
    if (this.settled) return;
    this.settled = true;
    this.parent.send({
      type: 'settled',
      run: this.id,
      figures: {
        ...memory.read(),
        cpuSeconds: Math.round((ownCpuSeconds() - this.cpuAtStart) * 100) / 100,
        marks: { ...this.marks },
        chunks: this.chunks,
        minorFaults: process.resourceUsage().minorPageFault - this.faultsAtStart,
        gc: gc.read(),
      },
    });
  }
}

/** What a role gives the child: a way to carry out the parent's commands, and to stop. */
export interface Role {
  /** Carries out `write`, `send` or `read` (whichever the role takes) for `run`. */
  handle(message: Exclude<ToChild, { type: 'arm' }>, run: Run): Promise<void>;
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

runChild<ToChild, FromChild>(async (parent) => {
  const role = await startRole({ currentRun: () => run, fail: parent.fail });
  return {
    ready: {},
    async handle(message) {
      if (message.type === 'arm') {
        run = new Run(parent, message.run, message.bytes);
        parent.send({ type: 'armed', run: message.run });
        return;
      }
      const current = run;
      if (current?.id !== message.run) {
        throw new Error(`${message.type} for run ${message.run}, which was not armed`);
      }
      await role.handle(message, current);
    },
    async stop() {
      memory.stop();
      await role.stop();
    },
  };
});
