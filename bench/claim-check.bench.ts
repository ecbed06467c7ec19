/**
 * Claim Check over RabbitMQ and the filesystem store, against plain filesystem write-then-read
 * of the same bytes, in the same run, on the same filesystem.
 *
 *   npm run bench:claim-check
 *
 * The payload is `BENCH_CC_MB` MiB generated from a seed as a stream of fresh chunks
 * (claim-check.payload.ts): both paths get the very same bytes, and nothing ever holds the whole
 * payload. Each role runs in a process of its own (forked, as plain JavaScript), so that the peak
 * RSS and CPU it reports are its own; the sizes of the two reading sides' chunks are Node's
 * file-stream default (64 KiB) in both paths.
 * (a) baseline: the writer pipes the stream through a SHA-256 Transform into
 *     `fs.createWriteStream` of a new file under `<temp dir>/baseline`; when the file is closed
 *     the writer reports path, SHA-256 and size to this process, which hands them to the reader
 *     (the baseline's "ticket" travels over IPC); the reader reads the file with
 *     `fs.createReadStream`, hashes every chunk, and checks hash and size. The clock stops when
 *     the reader has checked the last byte; the file is deleted after that.
 * (b) module: the sender calls `ClaimCheckService.publish(queue, Readable)`; over the threshold
 *     the library streams the payload through its SHA-256 meter into the FilesystemPayloadStore
 *     under `<temp dir>/store` (temporary file, metadata, rename), publishes the HMAC-signed
 *     ticket through RabbitMqTransport (confirm channel, persistent message) and marks the
 *     payload published. In the receiver a `@ClaimCheck` handler (`deleteAfter: 'ack'`) gets the
 *     payload once the library verified the ticket, claimed it in the memory ledger and read its
 *     metadata, and reads `payload.stream()` to the end; the library hashes every chunk and
 *     checks hash and size against the ticket. The clock stops when the handler's stream ended,
 *     verified; the library then deletes the payload and acks.
 * Both paths hash once on the write side and once on the read side, and write and read the bytes
 * once each through the page cache of the same filesystem. The clock starts when this process
 * tells the writer (a) or the sender (b) to begin.
 *
 * One warm-up round (discarded), then `BENCH_CC_ROUNDS` rounds alternating a and b (a b, b a, a b,
 * ...); one JSON line on stdout with the medians, the median of the per-round ratios (a's time /
 * b's time) and of the CPU ratios (CPU seconds of a's processes / b's, RabbitMQ's included), the
 * peak RSS of every role (sampled every `BENCH_RSS_SAMPLE_MS`, and the kernel's VmHWM), where the
 * time went (each role's marks), the CPU seconds, page faults and GC pauses of each process,
 * RabbitMQ's CPU, and the machine's load (other tenants included). Progress goes to stderr.
 * After each run: both paths moved the same SHA-256, the queue and its `.dlq` are empty, and no
 * file is left; a ticket the receiver dead-letters fails the run at once, with its reason.
 *
 * Environment (defaults in brackets):
 *   AMQP_URL [amqp://guest:guest@127.0.0.1:5672]   BENCH_CC_MB [1024]   BENCH_CC_ROUNDS [3]
 *   BENCH_CC_CHUNK_KIB [1024]: size of each generated chunk
 *   BENCH_CC_DIR [os.tmpdir()]: where the run's temporary directory (store root and baseline) goes
 *   BENCH_RSS_SAMPLE_MS [10]   BENCH_RUN_TIMEOUT_S [300]
 *   BENCH_CPU_PROF_DIR [unset; when set, the children run with --cpu-prof into that directory]
 *   BENCH_CC_NODE_ARGS [none]: more Node options for the children, e.g. `--trace-gc`
 *   BENCH_UNSAFE_SOCKET_TRICKS [off; on, or both: every round without, then every round with]:
 *     the sender's and receiver's transport's `unsafeSocketTricks`, echoed as
 *     `unsafeSocketTricks` in the result line
 *
 * The queue (`nseq-bench-cc.<id>` and its `.dlq`), the temporary directory and the child
 * processes are unique to the run and removed at the end, also on failure or Ctrl-C
 * (harness/cleanup.ts); the exit code is non-zero on any error. The line has the harness's
 * envelope: `case` (`<mb>MiB`), `variant` (`default`, `socket-tricks`) and `at`.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, statSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import type * as amqp from 'amqplib';
import { BenchChild, type ChildOptions } from './harness/child-process';
import { runBench } from './harness/cleanup';
import { progress } from './harness/log';
import { buildPlainJs, type PlainJsBuild } from './harness/plain-js-build';
import { MiB, report, round2, variantOf } from './harness/report';
import { connectAmqp, newRunId, QueueJanitor, temporaryDirectory } from './harness/resources';
import { roundsOf } from './harness/rounds';
import {
  positiveInteger,
  positiveNumber,
  readSettings,
  servers,
  socketTrickVariants,
  textSetting,
  wordsSetting,
} from './harness/settings';
import {
  SIGNING_SECRET_ENV,
  type ChildConfig,
  type ChildRole,
  type FromChild,
  type ToChild,
} from './claim-check.protocol';
import { RunDriver, type Child } from './claim-check.runs';
import { durationsOf, summarize, type RunFigures } from './claim-check.summary';

const settings = readSettings(() => ({
  amqpUrl: servers.amqpUrl,
  totalBytes: Math.round(positiveNumber('BENCH_CC_MB', 1024) * MiB),
  rounds: positiveInteger('BENCH_CC_ROUNDS', 3),
  chunkBytes: Math.round(positiveNumber('BENCH_CC_CHUNK_KIB', 1024) * 1024),
  directory: textSetting('BENCH_CC_DIR') ?? tmpdir(),
  rssSampleMs: positiveNumber('BENCH_RSS_SAMPLE_MS', 10),
  runTimeoutMs: positiveNumber('BENCH_RUN_TIMEOUT_S', 300) * 1000,
  cpuProfileDir: textSetting('BENCH_CPU_PROF_DIR'),
  nodeArgs: wordsSetting('BENCH_CC_NODE_ARGS'),
  socketTricks: socketTrickVariants(),
}));

const runId = newRunId();
const queue = `nseq-bench-cc.${runId}`;

const gcMs = (side: RunFigures['write']) =>
  Math.round(Object.values(side.gc).reduce((sum, { ms }) => sum + ms, 0));

const describeRun = (figures: RunFigures, write: string, read: string) =>
  `${figures.mbps} MB/s (${write} ${figures.write.hwmRssMiB ?? figures.write.peakRssMiB} MiB / ` +
  `${read} ${figures.read.hwmRssMiB ?? figures.read.peakRssMiB} MiB rss, faults ` +
  `${figures.write.minorFaults}/${figures.read.minorFaults}, gc ${gcMs(figures.write)}/` +
  `${gcMs(figures.read)} ms, cpu ` +
  `${figures.write.cpuSeconds}+${figures.read.cpuSeconds}+rmq ${figures.cpu.rabbitmq ?? '?'} s, ` +
  `machine ${figures.machineBusyCores ?? '?'} cores busy; ` +
  `${JSON.stringify(durationsOf(figures))})`;

async function main(): Promise<void> {
  const loadAtStart = loadavg().map(round2);
  progress(
    `run ${runId}: ${cpus().length} cores, node ${process.version}, load average ` +
      `${loadAtStart.join(' ')}; ${settings.totalBytes / MiB} MiB in ${settings.chunkBytes / 1024} ` +
      `KiB chunks, ${settings.rounds} rounds + 1 warm-up`,
  );

  const build = buildPlainJs();
  const dir = temporaryDirectory('nseq-bench-cc-', settings.directory);
  const storeRoot = join(dir, 'store');
  const baselineDir = join(dir, 'baseline');
  for (const made of [storeRoot, baselineDir]) mkdirSync(made, { mode: 0o700 });
  if (statSync(storeRoot).dev !== statSync(baselineDir).dev) {
    throw new Error('the store root and the baseline directory are on different filesystems');
  }

  const connection = await connectAmqp(settings.amqpUrl);
  const queues = new QueueJanitor(settings.amqpUrl, `${queue}{,.dlq}`);
  queues.track(queue, `${queue}.dlq`);
  const admin = await connection.createChannel();
  admin.on('error', (error: Error) => progress(`amqplib channel: ${error.message}`));

  const context: VariantContext = {
    build,
    signingSecret: randomBytes(32).toString('hex'),
    admin,
    storeRoot,
    baselineDir,
    loadAtStart,
  };
  for (const unsafeSocketTricks of settings.socketTricks) {
    await runVariant(context, unsafeSocketTricks);
  }
}

/** What every variant's rounds share: the children's build and secret, the queue's admin channel, paths. */
interface VariantContext {
  readonly build: PlainJsBuild;
  readonly signingSecret: string;
  readonly admin: amqp.Channel;
  readonly storeRoot: string;
  readonly baselineDir: string;
  readonly loadAtStart: number[];
}

function startChild(context: VariantContext, config: ChildConfig): Promise<Child> {
  const options: ChildOptions = {
    label: config.role,
    entry: join(__dirname, 'claim-check.child.ts'),
    build: context.build,
    config,
    // The secret goes by environment, not argv: command lines are world-readable in /proc.
    env: { [SIGNING_SECRET_ENV]: context.signingSecret },
    nodeArgs: settings.nodeArgs,
    cpuProfileDir: settings.cpuProfileDir,
  };
  return BenchChild.start<ToChild, FromChild>(options).then((child) => {
    progress(`${config.role}: pid ${child.ready.pid}, idle RSS ${child.ready.idleRssMiB} MiB`);
    return child;
  });
}

/** Every round of both paths, the module's with `unsafeSocketTricks` as given; one JSON line. */
async function runVariant(context: VariantContext, unsafeSocketTricks: boolean): Promise<void> {
  const { admin, storeRoot, baselineDir, loadAtStart } = context;
  // One seed for all: the writer and the sender generate the same bytes.
  const seed = randomBytes(16).toString('hex');
  const config = (role: ChildRole): ChildConfig => ({
    role,
    seed,
    chunkBytes: settings.chunkBytes,
    storeRoot,
    amqpUrl: settings.amqpUrl,
    queue,
    signingKeyId: `bench-${runId}`,
    unsafeSocketTricks,
    rssSampleMs: settings.rssSampleMs,
  });
  // The receiver first: its subscription declares the queue the sender publishes to.
  const receiver = await startChild(context, config('receiver'));
  const [writer, reader, sender] = await Promise.all(
    (['writer', 'reader', 'sender'] as const).map((role) => startChild(context, config(role))),
  );
  const runs = new RunDriver(
    { writer, reader, sender, receiver },
    {
      bytes: settings.totalBytes,
      timeoutMs: settings.runTimeoutMs,
      admin,
      queue,
      storeRoot,
      baselineDir,
    },
  );

  const baseline: RunFigures[] = [];
  const module: RunFigures[] = [];
  for (const round of roundsOf({ rounds: settings.rounds, warmUp: true, alternate: true })) {
    const tag = round.label;
    let a: RunFigures;
    let b: RunFigures;
    if (round.baselineFirst) {
      a = await runs.baseline(`${tag} a`);
      b = await runs.module(`${tag} b`);
    } else {
      b = await runs.module(`${tag} b`);
      a = await runs.baseline(`${tag} a`);
    }
    if (a.sha256 !== b.sha256) {
      throw new Error(`the paths moved different bytes: SHA-256 ${a.sha256} and ${b.sha256}`);
    }
    progress(
      `${tag}: a ${describeRun(a, 'writer', 'reader')}; ` +
        `b ${describeRun(b, 'sender', 'receiver')}; ratio ${round2(a.seconds / b.seconds)} ` +
        `(${round.baselineFirst ? 'a first' : 'b first'})`,
    );
    if (round.warmUp) continue;
    baseline.push(a);
    module.push(b);
  }
  await Promise.all([writer, reader, sender, receiver].map((child) => child.stop()));

  const { bench, ratio, ...result } = summarize({
    totalBytes: settings.totalBytes,
    chunkBytes: settings.chunkBytes,
    baseline,
    module,
    idleRssMiB: {
      writer: writer.ready.idleRssMiB,
      reader: reader.ready.idleRssMiB,
      sender: sender.ready.idleRssMiB,
      receiver: receiver.ready.idleRssMiB,
    },
    machine: {
      cores: cpus().length,
      node: process.version,
      loadAverageAtStart: loadAtStart,
      loadAverageAtEnd: loadavg().map(round2),
    },
  });
  report(
    {
      bench,
      case: `${result.mb}MiB`,
      variant: variantOf(unsafeSocketTricks),
      ratio,
    },
    { ...result, unsafeSocketTricks },
  );
  progress(
    `baseline ${result.baselineMBps} MB/s, module ${result.moduleMBps} MB/s, ratio ` +
      `${ratio} (target ≥ ${result.ratioTarget}), CPU ratio ${result.cpuRatio}; peak RSS sender ` +
      `${result.senderPeakRssMiB} MiB, receiver ${result.receiverPeakRssMiB} MiB ` +
      `(target < ${result.rssTargetMiB} MiB)`,
  );
}

runBench('claim-check', main);
