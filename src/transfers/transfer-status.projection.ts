import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import { ResequenceHeader } from 'nest-sequence/wire';
import {
  ResequencerService,
  SEQUENCE_TRANSPORT,
  type Disposition,
  type GapEvent,
  type InboundMessage,
  type Subscription,
  type Transport,
} from 'nest-sequence';
import {
  FINAL_STATUS,
  statusOf,
  TRANSFER_STATUSES,
  type TransferStatus,
  type TransferStatusMessage,
} from './transfer-status.channels';
import { TransferStatusResequencer } from './transfer-status.resequencer';
import { TRANSFERS_SETTINGS } from './transfers.constants';
import type { TransfersSettings } from './transfers.environment';
import type { SimulationReport } from './upstream.simulator';

/** One transfer as `GET /transfers/:id/status` shows it. */
export interface TransferView {
  readonly id: string;
  /** Its latest status; null while a gap alert came before any status of it. */
  readonly status: TransferStatus | null;
  /** The status's sequence number (0 before any). */
  readonly seq: number;
  /** Present while the transfer waits for a status past the gap timeout. */
  readonly gap?: { readonly expected: number; readonly since: string };
}

/** `GET /transfers`: what the projection holds and what it refused. */
export interface TransfersSummary {
  readonly transfers: number;
  readonly byStatus: Readonly<Record<TransferStatus, number>>;
  /** Statuses that advanced a transfer. */
  readonly applied: number;
  /** A status equal to the transfer's current one, again (at-least-once delivery): ignored. */
  readonly duplicatesIgnored: number;
  /** A status below the transfer's current one: refused. The resequencer keeps this at 0. */
  readonly regressionsRefused: number;
  /** Gap alerts received; `gaps` lists those still open. */
  readonly gapAlerts: number;
  readonly gaps: readonly {
    readonly id: string;
    readonly expected: number;
    readonly since: string;
  }[];
}

interface Waiter {
  /** Transfers not done yet: true for one whose alerted gap is its end (the broken transfer). */
  readonly pending: Map<string, boolean>;
  readonly resolve: () => void;
}

const ACK: Disposition = { action: 'ack' };

/**
 * The read side: each transfer's latest status, built from the ordered channel. It only ever
 * advances: a status whose sequence is not greater than the transfer's current one is ignored (a
 * duplicate) or refused and counted (a regression, which ordered delivery must make impossible).
 * Gap alerts come from `ResequencerService.onGap`, on the instance whose drain delivered them.
 */
@Injectable()
export class TransferStatusProjection
  implements OnModuleInit, OnApplicationBootstrap, BeforeApplicationShutdown
{
  private readonly logger = new Logger(TransferStatusProjection.name);
  private readonly views = new Map<string, TransferView>();
  private readonly waiters = new Set<Waiter>();
  private subscription: Subscription | undefined;
  private stopListening: (() => void) | undefined;
  private applied = 0;
  private duplicatesIgnored = 0;
  private regressionsRefused = 0;
  private gapAlerts = 0;

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(TRANSFERS_SETTINGS) private readonly settings: TransfersSettings,
    private readonly resequencers: ResequencerService,
    private readonly resequencer: TransferStatusResequencer,
  ) {}

  onModuleInit(): void {
    this.stopListening = this.resequencers.onGap((event) => this.recordGap(event));
  }

  async onApplicationBootstrap(): Promise<void> {
    this.subscription = await this.transport.subscribe(this.settings.channels.ordered, (message) =>
      Promise.resolve(this.apply(message)),
    );
  }

  async beforeApplicationShutdown(): Promise<void> {
    this.stopListening?.();
    await this.subscription?.close();
    this.subscription = undefined;
  }

  /** The transfer's view, or undefined when nothing was heard of it. */
  get(id: string): TransferView | undefined {
    return this.views.get(id);
  }

  summary(): TransfersSummary {
    const byStatus = Object.fromEntries(TRANSFER_STATUSES.map((status) => [status, 0])) as Record<
      TransferStatus,
      number
    >;
    const gaps: { id: string; expected: number; since: string }[] = [];
    for (const view of this.views.values()) {
      if (view.status !== null) byStatus[view.status]++;
      if (view.gap) gaps.push({ id: view.id, ...view.gap });
    }
    return {
      transfers: this.views.size,
      byStatus,
      applied: this.applied,
      duplicatesIgnored: this.duplicatesIgnored,
      regressionsRefused: this.regressionsRefused,
      gapAlerts: this.gapAlerts,
      gaps,
    };
  }

  /**
   * Resolves once the simulation's statuses have all come through: every transfer settled but the
   * broken one, which waits on a gap that raised an alert; rejects after `timeoutMs`, saying how
   * many have not. An alert alone does not end any other transfer: one whose statuses arrive
   * further apart than the gap timeout (a loaded machine) is alerted, then its missing status
   * comes and it settles.
   */
  async whenFinal(
    simulation: Pick<SimulationReport, 'transferIds' | 'brokenTransferId'>,
    timeoutMs: number,
  ): Promise<void> {
    const pending = new Map(
      simulation.transferIds
        .map((id) => [id, id === simulation.brokenTransferId] as const)
        .filter(([id, gapEnds]) => !this.isDone(id, gapEnds)),
    );
    if (pending.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    let waiter: Waiter | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        waiter = { pending, resolve };
        this.waiters.add(waiter);
        timer = setTimeout(
          () =>
            reject(
              new Error(
                `${pending.size} transfer(s) not settled (or, the broken one, without a gap ` +
                  `alert) after ${timeoutMs} ms, e.g. ${[...pending.keys()].slice(0, 3).join(', ')}`,
              ),
            ),
          timeoutMs,
        );
      });
    } finally {
      clearTimeout(timer);
      if (waiter) this.waiters.delete(waiter);
    }
  }

  /** Settled; or, when `gapEnds`, waiting on a gap that raised an alert. */
  private isDone(id: string, gapEnds: boolean): boolean {
    const view = this.views.get(id);
    return view !== undefined && (view.status === FINAL_STATUS || (gapEnds && !!view.gap));
  }

  /** One status from the ordered channel. */
  private apply(message: InboundMessage): Disposition {
    const status = readStatus(message);
    if (typeof status === 'string') return { action: 'dead-letter', reason: status };
    const { id, seq } = status;
    const current = this.views.get(id);
    if (current && seq === current.seq) {
      this.duplicatesIgnored++;
      return ACK;
    }
    if (current && seq < current.seq) {
      this.regressionsRefused++;
      this.logger.error(
        `transfer ${id}: refused ${status.status} (seq ${seq}) after ${current.status} ` +
          `(seq ${current.seq}): statuses arrived out of order`,
      );
      return ACK;
    }
    // A status at or past the one a gap alert waited for closes the gap.
    const gap = current?.gap && current.gap.expected > seq ? current.gap : undefined;
    this.views.set(id, { id, status: status.status, seq, ...(gap && { gap }) });
    this.applied++;
    this.changed(id);
    return ACK;
  }

  private recordGap(event: GapEvent): void {
    if (event.resequencer !== this.resequencer.name || event.type !== 'alert') return;
    this.gapAlerts++;
    const current = this.views.get(event.key) ?? { id: event.key, status: null, seq: 0 };
    if (current.seq >= event.expected) return; // the missing status came in the meantime
    const since = new Date(event.gapSince).toISOString();
    this.views.set(event.key, { ...current, gap: { expected: event.expected, since } });
    this.changed(event.key);
  }

  private changed(id: string): void {
    for (const waiter of this.waiters) {
      const gapEnds = waiter.pending.get(id);
      if (gapEnds === undefined || !this.isDone(id, gapEnds)) continue;
      waiter.pending.delete(id);
      if (waiter.pending.size === 0) waiter.resolve();
    }
  }
}

/** The transfer and status a message carries, or why it cannot be applied. */
function readStatus(
  message: InboundMessage,
): { id: string; seq: number; status: TransferStatus } | string {
  const id = message.headers[ResequenceHeader.key];
  const seq = Number(message.headers[ResequenceHeader.seq]);
  const expected = statusOf(seq);
  if (typeof id !== 'string' || id === '' || !Number.isSafeInteger(seq) || !expected) {
    return `not a transfer status: ${ResequenceHeader.key}=${String(id)}, ${ResequenceHeader.seq}=${String(message.headers[ResequenceHeader.seq])}`;
  }
  let body: Partial<TransferStatusMessage>;
  try {
    body = JSON.parse(message.body.toString('utf8')) as Partial<TransferStatusMessage>;
  } catch {
    return `transfer ${id}, seq ${seq}: the body is not JSON`;
  }
  if (body.transferId !== id || body.status !== expected) {
    return (
      `transfer ${id}, seq ${seq}: the body says ${String(body.transferId)} ${String(body.status)}, ` +
      `the headers ${id} ${expected}`
    );
  }
  return { id, seq, status: expected };
}
