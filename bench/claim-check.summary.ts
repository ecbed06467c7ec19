/**
 * The Claim Check benchmark's arithmetic: one run's figures from what its two children and the
 * machine reported, the phases of a run, and the result line over every measured round.
 */
import type { CpuSpent } from './harness/cpu';
import { median, medianOf, MiB, round1, round2 } from './harness/report';
import type { ChildFigures } from './claim-check.protocol';

export const RATIO_TARGET = 0.8;
/** "Peak RSS under 150 MB", read as MiB like every size of docs/benchmarks.md. */
export const RSS_TARGET_MIB = 150;

export interface RunFigures {
  readonly path: 'baseline' | 'module';
  /** When the clock started (epoch ms). */
  readonly t0: number;
  readonly seconds: number;
  readonly mbps: number;
  readonly sha256: string;
  /** The writer (a) or the sender (b). */
  readonly write: ChildFigures;
  /** The reader (a) or the receiver (b). */
  readonly read: ChildFigures;
  /** Each side's marks in ms since the clock started. */
  readonly marksMs: { write: Record<string, number>; read: Record<string, number> };
  /** CPU seconds during the run: each side, RabbitMQ, and this (parent) process. */
  readonly cpu: { write: number; read: number; rabbitmq?: number; parent: number };
  /** Cores busy on the whole machine during the run (2 = this machine saturated). */
  readonly machineBusyCores?: number;
  /** Of those, cores busy with anything but the run's processes and RabbitMQ: other tenants. */
  readonly otherBusyCores?: number;
}

export function figuresOf(input: {
  path: RunFigures['path'];
  bytes: number;
  t0: number;
  doneAt: number;
  sha256: string;
  write: ChildFigures;
  read: ChildFigures;
  /** CPU the parent (`own`), RabbitMQ and the machine spent from the start to the end. */
  cpu: CpuSpent;
}): RunFigures {
  const { cpu: spent, t0 } = input;
  const seconds = (input.doneAt - t0) / 1000;
  const since = (marks: Readonly<Record<string, number>>) =>
    Object.fromEntries(Object.entries(marks).map(([name, at]) => [name, Math.round(at - t0)]));
  const rounded = (value?: number) => (value === undefined ? undefined : round2(value));
  const rabbitmq = rounded(spent.servers.rabbitmq);
  const parent = round2(spent.own);
  const wall = spent.wallSeconds;
  const machine = rounded(spent.machine);
  const ours = input.write.cpuSeconds + input.read.cpuSeconds + parent + (rabbitmq ?? 0);
  return {
    path: input.path,
    t0,
    seconds,
    mbps: round1(input.bytes / MiB / seconds),
    sha256: input.sha256,
    write: input.write,
    read: input.read,
    marksMs: { write: since(input.write.marks), read: since(input.read.marks) },
    cpu: { write: input.write.cpuSeconds, read: input.read.cpuSeconds, rabbitmq, parent },
    machineBusyCores: machine === undefined ? undefined : round2(machine / wall),
    otherBusyCores: machine === undefined ? undefined : round2(Math.max(0, machine - ours) / wall),
  };
}

/** Where one run's time went, in ms (NaN where a mark is missing). */
export function durationsOf(figures: RunFigures): Record<string, number> {
  const w = figures.marksMs.write;
  const r = figures.marksMs.read;
  const span = (from?: number, to?: number) =>
    from === undefined || to === undefined ? Number.NaN : to - from;
  const totalMs = Math.round(figures.seconds * 1000);
  if (figures.path === 'baseline') {
    return {
      writeMs: span(0, w.written),
      handoffMs: span(w.written, r.start),
      readMs: span(r.start, r.readEnd),
      totalMs,
    };
  }
  return {
    // Until the store's put begins: publish reads past the inline threshold first.
    beforePutMs: span(0, w.putStart),
    putMs: span(w.putStart, w.putEnd),
    // Ticket published, confirmed, delivered, verified and claimed; then the payload's head.
    ticketMs: span(w.putEnd, r.headStart),
    headToHandlerMs: span(r.headStart, r.handlerStart),
    openMs: span(r.getStart, r.getEnd),
    readMs: span(r.handlerStart, r.handlerEnd),
    // The sender's own tail: confirm of the ticket and markPublished, after put.
    senderPublishMs: span(w.putEnd, w.published),
    deleteMs: span(r.deleteStart, r.deleteEnd),
    totalMs,
  };
}

const maxOf = (values: ReadonlyArray<number | undefined>): number | undefined => {
  const present = values.filter((value): value is number => value !== undefined);
  return present.length > 0 ? Math.max(...present) : undefined;
};

/** The highest of the sampled peak and VmHWM over the rounds: what the target is judged on. */
function peakOf(figures: readonly ChildFigures[]): number {
  return Math.max(...figures.map((side) => Math.max(side.peakRssMiB, side.hwmRssMiB ?? 0)));
}

/** When (ms after the clock started) and of what the highest sampled peak of one side was. */
function peakDetailOf(runs: readonly RunFigures[], side: 'write' | 'read') {
  const top = runs.reduce((best, run) =>
    run[side].peakRssMiB > best[side].peakRssMiB ? run : best,
  );
  const { peakAt, peakHeapMiB, peakBuffersMiB } = top[side];
  return {
    atMs: peakAt === undefined ? undefined : Math.round(peakAt - top.t0),
    heapMiB: peakHeapMiB,
    buffersMiB: peakBuffersMiB,
  };
}

function cpuOf(runs: readonly RunFigures[], write: string, read: string) {
  const cpu = medianOf(
    runs.map((run) => ({
      [write]: run.cpu.write,
      [read]: run.cpu.read,
      rabbitmq: run.cpu.rabbitmq,
      parent: run.cpu.parent,
    })),
  );
  const seconds = median(runs.map((run) => run.seconds));
  const total = Object.values(cpu).reduce((sum, value) => sum + value, 0);
  return { ...cpu, busyCores: round2(total / seconds) };
}

/** Median minor page faults and GC pauses (count, ms by kind) of one side over the rounds. */
function memoryWorkOf(sides: readonly ChildFigures[]) {
  const gc = medianOf(
    sides.map((side) =>
      Object.fromEntries(
        Object.entries(side.gc).flatMap(([kind, { count, ms }]) => [
          [`${kind}Count`, count],
          [`${kind}Ms`, ms],
        ]),
      ),
    ),
  );
  return { minorFaults: median(sides.map((side) => side.minorFaults)), gc };
}

export interface SummaryInput {
  totalBytes: number;
  chunkBytes: number;
  baseline: readonly RunFigures[];
  module: readonly RunFigures[];
  idleRssMiB: Record<'writer' | 'reader' | 'sender' | 'receiver', number>;
  machine: {
    cores: number;
    node: string;
    loadAverageAtStart: number[];
    loadAverageAtEnd: number[];
  };
}

/** The result line: medians over the measured rounds, and the targets. */
export function summarize(input: SummaryInput) {
  const { baseline, module } = input;
  const ratios = baseline.map((a, i) => a.seconds / module[i].seconds);
  const senderPeakRssMiB = peakOf(module.map((run) => run.write));
  const receiverPeakRssMiB = peakOf(module.map((run) => run.read));
  const ratio = round2(median(ratios));
  // Less sensitive to other tenants than time: CPU seconds of a's processes over b's.
  const cpuRatios = baseline.map(
    (a, i) =>
      (a.cpu.write + a.cpu.read) /
      (module[i].cpu.write + module[i].cpu.read + (module[i].cpu.rabbitmq ?? 0)),
  );
  const busy = (runs: readonly RunFigures[], pick: (run: RunFigures) => number | undefined) => {
    const values = runs.map(pick).filter((value): value is number => value !== undefined);
    return values.length > 0 ? round2(median(values)) : undefined;
  };
  return {
    bench: 'claim-check',
    mb: input.totalBytes / MiB,
    chunkKiB: input.chunkBytes / 1024,
    rounds: baseline.length,
    baselineMBps: round1(median(baseline.map((run) => run.mbps))),
    moduleMBps: round1(median(module.map((run) => run.mbps))),
    ratio,
    ratios: ratios.map(round2),
    ratioTarget: RATIO_TARGET,
    ratioTargetMet: ratio >= RATIO_TARGET,
    cpuRatio: round2(median(cpuRatios)),
    cpuRatios: cpuRatios.map(round2),
    // Max over the measured rounds of the sampled peak and the kernel's VmHWM.
    senderPeakRssMiB,
    receiverPeakRssMiB,
    rssTargetMiB: RSS_TARGET_MIB,
    rssTargetMet: Math.max(senderPeakRssMiB, receiverPeakRssMiB) < RSS_TARGET_MIB,
    rssMiB: {
      sampled: {
        writer: maxOf(baseline.map((run) => run.write.peakRssMiB)),
        reader: maxOf(baseline.map((run) => run.read.peakRssMiB)),
        sender: maxOf(module.map((run) => run.write.peakRssMiB)),
        receiver: maxOf(module.map((run) => run.read.peakRssMiB)),
      },
      hwm: {
        writer: maxOf(baseline.map((run) => run.write.hwmRssMiB)),
        reader: maxOf(baseline.map((run) => run.read.hwmRssMiB)),
        sender: maxOf(module.map((run) => run.write.hwmRssMiB)),
        receiver: maxOf(module.map((run) => run.read.hwmRssMiB)),
      },
      idle: input.idleRssMiB,
      senderPeak: peakDetailOf(module, 'write'),
      receiverPeak: peakDetailOf(module, 'read'),
    },
    phasesMs: {
      baseline: medianOf(baseline.map(durationsOf)),
      module: medianOf(module.map(durationsOf)),
    },
    readChunks: {
      reader: baseline[0]?.read.chunks,
      receiver: module[0]?.read.chunks,
    },
    // Memory the process touched anew (page faults) and the GC's main-thread pauses.
    memoryWork: {
      writer: memoryWorkOf(baseline.map((run) => run.write)),
      reader: memoryWorkOf(baseline.map((run) => run.read)),
      sender: memoryWorkOf(module.map((run) => run.write)),
      receiver: memoryWorkOf(module.map((run) => run.read)),
    },
    cpuSeconds: {
      baseline: cpuOf(baseline, 'writer', 'reader'),
      module: cpuOf(module, 'sender', 'receiver'),
    },
    machine: {
      ...input.machine,
      busyCores: {
        baseline: busy(baseline, (run) => run.machineBusyCores),
        module: busy(module, (run) => run.machineBusyCores),
      },
      otherTenantsBusyCores: {
        baseline: busy(baseline, (run) => run.otherBusyCores),
        module: busy(module, (run) => run.otherBusyCores),
      },
    },
  };
}
