import { Injectable } from '@nestjs/common';
import type { Counter } from 'prom-client';
import type { SweepReason } from '../ports/payload-store.port';
import { ModuleMetrics } from '../kernel/module-metrics';

/** prom-client metrics of Claim Check, in the same registry and with the same prefix as the rest. */
@Injectable()
export class ClaimCheckMetrics {
  private readonly checkIns: Counter<'store'>;
  private readonly bytesStored: Counter<'store'>;
  private readonly checkOuts: Counter<'store'>;
  private readonly messages: Counter<'channel' | 'via'>;
  private readonly duplicates: Counter<'channel'>;
  private readonly rejected: Counter<'channel' | 'reason'>;
  private readonly integrity: Counter<'channel'>;
  private readonly deleted: Counter<'store' | 'reason'>;
  private readonly handlerFailures: Counter<'channel'>;

  constructor(metrics: ModuleMetrics) {
    const counter = metrics.counter.bind(metrics);

    this.checkIns = counter('claim_check_payloads_checked_in_total', 'Payloads parked', ['store']);
    this.bytesStored = counter('claim_check_bytes_stored_total', 'Payload bytes parked', ['store']);
    this.checkOuts = counter('claim_check_payloads_checked_out_total', 'Tickets resolved', [
      'store',
    ]);
    this.messages = counter('claim_check_messages_received_total', 'Claim Check messages', [
      'channel',
      'via',
    ]);
    this.duplicates = counter(
      'claim_check_duplicates_total',
      'Tickets delivered again after their group handled them (acked, handler skipped)',
      ['channel'],
    );
    this.rejected = counter('claim_check_rejected_total', 'Claim Check messages dead-lettered', [
      'channel',
      'reason',
    ]);
    this.integrity = counter(
      'claim_check_integrity_failures_total',
      'Payloads whose bytes did not match their ticket',
      ['channel'],
    );
    this.deleted = counter(
      'claim_check_payloads_deleted_total',
      'Payloads deleted: after their consumers (retention) or by the orphan sweeper',
      ['store', 'reason'],
    );
    this.handlerFailures = counter(
      'claim_check_handler_failures_total',
      'Handler calls that threw',
      ['channel'],
    );
  }

  checkedIn(store: string, bytes: number): void {
    this.checkIns.inc({ store });
    this.bytesStored.inc({ store }, bytes);
  }

  checkedOut(store: string): void {
    this.checkOuts.inc({ store });
  }

  received(channel: string, via: 'inline' | 'ticket' | 'sequence'): void {
    this.messages.inc({ channel, via });
  }

  duplicate(channel: string): void {
    this.duplicates.inc({ channel });
  }

  rejectedMessage(channel: string, reason: string): void {
    this.rejected.inc({ channel, reason });
    if (reason === 'integrity-mismatch') this.integrity.inc({ channel });
  }

  handlerFailed(channel: string): void {
    this.handlerFailures.inc({ channel });
  }

  /** `reason`: `consumed` (retention after handlers) or a sweep reason. */
  payloadDeleted(store: string, reason: 'consumed' | SweepReason): void {
    this.deleted.inc({ store, reason });
  }
}
