import { randomBytes, randomInt } from 'node:crypto';
import { Inject, Injectable } from '@nestjs/common';
import { ResequenceHeader } from 'nest-sequence/wire';
import { SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { seqOf, type TransferStatus, type TransferStatusMessage } from './transfer-status.channels';
import { TRANSFERS_SETTINGS } from './transfers.constants';
import type { TransfersSettings } from './transfers.environment';

/** The upstream services, each the source of one status of every transfer. */
export const UPSTREAM_SERVICES: Readonly<Record<TransferStatus, string>> = {
  initiated: 'payer-bank-gateway',
  processing: 'fraud-and-limits',
  settled: 'central-bank-settlement',
};

/** Which status the simulation never sends, for one transfer, to show a gap alert. */
export const LOST_STATUS: TransferStatus = 'processing';

/** What one simulation published. */
export interface SimulationReport {
  /** Every transfer id, in creation order. */
  readonly transferIds: readonly string[];
  /** The transfer whose {@link LOST_STATUS} was never sent. */
  readonly brokenTransferId: string;
  /** Statuses published, by upstream service. */
  readonly published: Readonly<Record<string, number>>;
}

interface PlannedStatus {
  readonly transferId: string;
  readonly status: TransferStatus;
  readonly amountCents: number;
}

/** Several publishes in flight per service: they land in whatever order the broker confirms. */
const CONCURRENCY_PER_SERVICE = 8;

/**
 * Three upstream services publishing the statuses of many transfers to the shuffled channel
 * through the module's transport, concurrently and each in a shuffled order: a transfer's
 * `settled` may well be published before its `initiated`. Every status carries
 * `x-resequence-key` (the transfer id) and `x-resequence-seq` (initiated 1, processing 2,
 * settled 3), all the resequencer needs to put them back in order.
 */
@Injectable()
export class UpstreamSimulator {
  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(TRANSFERS_SETTINGS) private readonly settings: TransfersSettings,
  ) {}

  /**
   * Publishes every status of `transfers` new transfers, except {@link LOST_STATUS} of one of
   * them (the middle one); resolves once the broker confirmed them all.
   */
  async run(transfers: number): Promise<SimulationReport> {
    const transferIds = newTransferIds(transfers);
    const brokenTransferId = transferIds[Math.floor(transfers / 2)];
    const byService = new Map<string, PlannedStatus[]>(
      Object.values(UPSTREAM_SERVICES).map((service) => [service, []]),
    );
    for (const transferId of transferIds) {
      const amountCents = randomInt(100, 1_000_000);
      for (const [status, service] of Object.entries(UPSTREAM_SERVICES) as [
        TransferStatus,
        string,
      ][]) {
        if (transferId === brokenTransferId && status === LOST_STATUS) continue;
        byService.get(service)!.push({ transferId, status, amountCents });
      }
    }
    await Promise.all(
      [...byService].map(([service, statuses]) => this.publishAll(service, shuffle(statuses))),
    );
    const published = Object.fromEntries(
      [...byService].map(([service, statuses]) => [service, statuses.length]),
    );
    return { transferIds, brokenTransferId, published };
  }

  /** One service's statuses, in the given order, a few in flight at a time. */
  private async publishAll(service: string, statuses: readonly PlannedStatus[]): Promise<void> {
    let next = 0;
    const worker = async () => {
      while (next < statuses.length) await this.publish(service, statuses[next++]);
    };
    await Promise.all(Array.from({ length: CONCURRENCY_PER_SERVICE }, worker));
  }

  private publish(source: string, { transferId, status, amountCents }: PlannedStatus) {
    const message: TransferStatusMessage = {
      transferId,
      status,
      at: new Date().toISOString(),
      source,
      amountCents,
    };
    return this.transport.publish(
      this.settings.channels.shuffled,
      Buffer.from(JSON.stringify(message)),
      {
        [ResequenceHeader.key]: transferId,
        [ResequenceHeader.seq]: seqOf(status),
        'content-type': 'application/json',
      },
    );
  }
}

/**
 * Ids shaped like PIX end-to-end ids (`E`, the payer bank's 8-digit ISPB, yyyyMMddHHmm, 11
 * characters): the last 11 hold a random run tag and a counter, so that runs sharing a store never
 * reuse a transfer id (a reused id would find the previous run's statuses already released).
 */
function newTransferIds(count: number): string[] {
  const stamp = new Date().toISOString().replace(/\D/g, '').slice(0, 12);
  const runTag = randomBytes(4).toString('hex').slice(0, 5).toUpperCase();
  return Array.from(
    { length: count },
    (_, index) => `E00000000${stamp}${runTag}${String(index + 1).padStart(6, '0')}`,
  );
}

/** Fisher–Yates, in place. */
function shuffle<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = randomInt(i + 1);
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}
