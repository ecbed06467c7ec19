/**
 * One run of each path of the Claim Check benchmark, driven from the parent: arm both children,
 * start the clock, start the writing side, wait for the reading side's last verified byte, wait
 * for both to settle, check that nothing was left behind, and put the figures together.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import type * as amqp from 'amqplib';
import type { BenchChild, Received } from './harness/child-process';
import { CpuMeter, type CpuReading } from './harness/cpu';
import { epochMs } from './harness/measure';
import type { FromChild, ToChild } from './claim-check.protocol';
import { figuresOf, type RunFigures } from './claim-check.summary';

export type Child = BenchChild<ToChild, FromChild>;

export interface Children {
  readonly writer: Child;
  readonly reader: Child;
  readonly sender: Child;
  readonly receiver: Child;
}

/** Arms `child` for a run and waits until it is. */
async function arm(child: Child, run: string, bytes: number): Promise<void> {
  child.send({ type: 'arm', run, bytes });
  const armed = await child.next('armed', 10_000);
  if (armed.run !== run) throw new Error(`${child.label} armed ${armed.run}, not ${run}`);
}

export interface RunSettings {
  readonly bytes: number;
  /** How long the writing side and the reading side may take each. */
  readonly timeoutMs: number;
  /** A channel for checking the queue after each module run. */
  readonly admin: amqp.Channel;
  readonly queue: string;
  /** Must hold no file after a module run: the receiver deletes each payload once handled. */
  readonly storeRoot: string;
  /** Where the baseline's files go; must hold no file after a baseline run. */
  readonly baselineDir: string;
}

export class RunDriver {
  private readonly cpu = new CpuMeter(['rabbitmq']);

  constructor(
    private readonly children: Children,
    private readonly settings: RunSettings,
  ) {}

  /** (a) writer → file; its path and SHA-256 handed to the reader; reader reads and checks. */
  async baseline(run: string): Promise<RunFigures> {
    const { writer, reader } = this.children;
    const { bytes, timeoutMs } = this.settings;
    await Promise.all([arm(writer, run, bytes), arm(reader, run, bytes)]);
    const path = join(this.settings.baselineDir, `${run.replace(/\W+/g, '-')}.bin`);
    const before = this.cpu.read();
    const t0 = epochMs();
    writer.send({ type: 'write', run, path });
    const stored = await writer.next('stored', timeoutMs);
    reader.send({ type: 'read', run, path, sha256: stored.sha256, bytes: stored.bytes });
    const done = await reader.next('done', timeoutMs);
    const figures = await this.finish('baseline', t0, before, stored, done, writer, reader);
    this.assertNoFiles(this.settings.baselineDir);
    return figures;
  }

  /** (b) sender: ClaimCheckService.publish; receiver: the @ClaimCheck handler reads it. */
  async module(run: string): Promise<RunFigures> {
    const { sender, receiver } = this.children;
    const { bytes, timeoutMs } = this.settings;
    await Promise.all([arm(sender, run, bytes), arm(receiver, run, bytes)]);
    const before = this.cpu.read();
    const t0 = epochMs();
    sender.send({ type: 'send', run });
    const storedNext = sender.next('stored', timeoutMs);
    const doneNext = receiver.next('done', timeoutMs);
    // Either failing fails the run at once (the other's later failure is not news).
    storedNext.catch(() => undefined);
    doneNext.catch(() => undefined);
    const watch = this.watchDeadLetters();
    let stored: Received<FromChild, 'stored'>;
    let done: Received<FromChild, 'done'>;
    try {
      [stored, done] = await Promise.race([Promise.all([storedNext, doneNext]), watch.failed]);
    } finally {
      watch.stop();
    }
    const figures = await this.finish('module', t0, before, stored, done, sender, receiver);
    const { queue, admin } = this.settings;
    for (const name of [queue, `${queue}.dlq`]) {
      const { messageCount } = await admin.checkQueue(name);
      if (messageCount > 0) throw new Error(`${messageCount} message(s) left in ${name}`);
    }
    this.assertNoFiles(this.settings.storeRoot);
    return figures;
  }

  /** Waits for the writing and the reading side to settle, and puts the run's figures together. */
  private async finish(
    path: RunFigures['path'],
    t0: number,
    before: CpuReading,
    stored: Received<FromChild, 'stored'>,
    done: Received<FromChild, 'done'>,
    writing: Child,
    reading: Child,
  ): Promise<RunFigures> {
    const { bytes } = this.settings;
    if (stored.bytes !== bytes || done.bytes !== bytes) {
      throw new Error(`${path}: stored ${stored.bytes} and read ${done.bytes} of ${bytes} bytes`);
    }
    const [written, read] = await Promise.all([
      writing.next('settled', 60_000),
      reading.next('settled', 60_000),
    ]);
    return figuresOf({
      path,
      bytes,
      t0,
      doneAt: done.receivedAt,
      sha256: stored.sha256,
      write: written.figures,
      read: read.figures,
      cpu: CpuMeter.spent(before, this.cpu.read()),
    });
  }

  /**
   * A ticket the receiver refused is dead-lettered and its handler never runs: fail the run with
   * the reason at once instead of waiting out the timeout for a `done` that cannot come.
   */
  private watchDeadLetters(): { failed: Promise<never>; stop(): void } {
    const deadLetterQueue = `${this.settings.queue}.dlq`;
    let watching = true;
    const failed = (async (): Promise<never> => {
      while (watching) {
        const message = await this.settings.admin.get(deadLetterQueue, { noAck: true });
        if (message) {
          const reason: unknown = message.properties.headers?.['x-death-reason'];
          throw new Error(`the receiver dead-lettered the ticket: ${String(reason)}`);
        }
        await new Promise((wake) => setTimeout(wake, 250));
      }
      return new Promise<never>(() => undefined);
    })();
    failed.catch(() => undefined);
    return { failed, stop: () => (watching = false) };
  }

  private assertNoFiles(dir: string): void {
    const left = readdirSync(dir, { withFileTypes: true, recursive: true })
      .filter((entry) => entry.isFile())
      .map((entry) => join(entry.parentPath, entry.name));
    if (left.length > 0) throw new Error(`files left after the run: ${left.join(', ')}`);
  }
}
