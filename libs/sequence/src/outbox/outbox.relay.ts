import { Logger } from '@nestjs/common';
import type { OutboxMetrics } from './outbox.metrics';
import type { BoxLifecycle } from './outbox.events';
import type {
  ClaimedBatch,
  OutboxStore,
  RecordOutcome,
  StoredRecord,
} from '../ports/outbox-store.port';
import { isUnsendable, type Transport } from '../ports/transport.port';
import type { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
} from './outbox-message.codec';
import type { ResolvedOptions } from '../options/resolved-options';
import { BoxWorker, type CycleState } from './box-worker';
import { OutboxTracing } from './outbox.tracing';
import { errorMessage } from '../core/errors/caught';

/**
 * The relay of one outbox box: claims due records, publishes each to its channel(s) with a
 * confirm, and settles it in the same transaction as the claim: `COMPLETED`, or `PENDING` again
 * with a backoff, or `FAILED` after `retry.attempts`. A relay that dies mid-batch leaves the records
 * `PENDING` (the claim was only a row lock), so they are published again: at least once, and the
 * receiving inbox drops the duplicates.
 *
 * Records of a batch are published concurrently; with `ordered`, records of one aggregate one
 * after the other, and a failure holds back the rest of that aggregate only.
 */
export class OutboxRelay extends BoxWorker<'outbox_events' | 'outbox_commands'> {
  private readonly logger = new Logger(OutboxRelay.name);
  /** It only publishes: nothing in its handling opens a transaction to join the claim. */
  protected override readonly joinsClaim = false;
  /**
   * Its outcomes follow the broker's confirms: one a database crash loses only publishes its
   * record again, as at-least-once allows, so its claims need not wait for a disk flush.
   */
  protected override readonly settlesDurably = false;

  constructor(
    box: 'outbox_events' | 'outbox_commands',
    store: OutboxStore,
    private readonly transport: Transport,
    private readonly resolved: Pick<ResolvedOptions, 'outbox' | 'publish' | 'tracing'>,
    metrics: OutboxMetrics,
    lifecycle: BoxLifecycle,
  ) {
    super(box, store, resolved.outbox.boxes[box], metrics, lifecycle);
  }

  protected channelOf(record: StoredRecord): string {
    try {
      return this.channelsOf(record)[0];
    } catch {
      return '';
    }
  }

  protected async handleBatch(batch: ClaimedBatch, cycle: CycleState): Promise<RecordOutcome[]> {
    const outcomes: RecordOutcome[] = [];
    /**
     * Why the transport cannot publish: known before the batch (a broker that blocks the
     * connection, in an alarm, would take publishes it then holds, and each poll would add a
     * copy of the batch), or once a publish of this batch found it unreachable.
     */
    let away = await this.transportUnreachable();
    const groups = this.options.ordered
      ? byPartition(batch.records)
      : batch.records.map((r) => [r]);
    await Promise.all(
      groups.map(async (group) => {
        for (const record of group) {
          // No outcome: released, untouched (not an attempt).
          if (this.stopping || away !== undefined) return;
          const outcome = await this.publish(record);
          if ('unreachable' in outcome) {
            away ??= outcome.unreachable; // released, and the rest of the batch too
            return;
          }
          outcomes.push(outcome);
          if (outcome.status !== 'completed') return; // holds back the rest of its partition
        }
      }),
    );
    if (away !== undefined) {
      cycle.holdOff = true;
      this.logger.warn(
        `${this.box}: the broker is unreachable (${away}); ` +
          `${batch.records.length - outcomes.length} record(s) stay PENDING, not counted as ` +
          'attempts, until the next poll or wake-up',
      );
    }
    return outcomes;
  }

  /**
   * Publishes one record: its outcome, or `unreachable` when the publish failed while the
   * transport cannot reach its broker. An outage says nothing about the record: counted as
   * attempts, a long one would turn every pending record `FAILED`.
   */
  private async publish(record: StoredRecord): Promise<RecordOutcome | { unreachable: string }> {
    let channels: readonly string[];
    try {
      channels = this.channelsOf(record);
    } catch (error) {
      // A body that is not the JSON that was appended (edited by hand?) or a throwing route:
      // no retry will fix it.
      return this.failed(record, error, true);
    }
    const headers = {
      ...record.headers,
      [MESSAGE_ID_HEADER]: record.id,
      [MESSAGE_KIND_HEADER]: record.kind,
      [MESSAGE_TYPE_HEADER]: record.type,
      'content-type': 'application/json',
    };
    const body = Buffer.from(record.body);
    try {
      await OutboxTracing.relay(
        this.resolved.tracing,
        this.box,
        record,
        channels,
        async (traced) => {
          for (const channel of channels) {
            await this.transport.publish(channel, body, traced(headers), {
              timeoutMs: this.resolved.publish.confirmTimeoutMs,
            });
          }
        },
      );
    } catch (error) {
      const final = isUnsendable(error); // too large, or headers it cannot encode: no retry helps
      if (!final) {
        const unreachable = await this.transportUnreachable();
        if (unreachable !== undefined) return { unreachable };
      }
      return this.failed(record, error, final);
    }
    this.metrics.publishedOne(this.box, record.createdAt);
    this.lifecycle.published(record, channels);
    return { id: record.id, status: 'completed' };
  }

  /** Why the transport cannot publish now (its health check fails), or `undefined` if it can. */
  private async transportUnreachable(): Promise<string | undefined> {
    try {
      await this.transport.ping();
      return undefined;
    } catch (error) {
      return errorMessage(error);
    }
  }

  private channelsOf(record: StoredRecord): readonly string[] {
    const message = JSON.parse(record.body) as unknown;
    return this.box === 'outbox_events'
      ? this.resolved.outbox.routeEvent(message as OutboxEvent)
      : [this.resolved.outbox.routeCommand(message as OutboxCommand)];
  }
}

/** Records grouped by partition key (in seq order within each); no key: a group of one. */
function byPartition(records: readonly StoredRecord[]): StoredRecord[][] {
  const groups = new Map<string, StoredRecord[]>();
  const alone: StoredRecord[][] = [];
  for (const record of records) {
    if (record.partitionKey === null) {
      alone.push([record]);
      continue;
    }
    const group = groups.get(record.partitionKey) ?? [];
    group.push(record);
    groups.set(record.partitionKey, group);
  }
  return [...groups.values(), ...alone];
}
