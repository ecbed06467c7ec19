import type { Logger } from '@nestjs/common';
import { SequenceHeader, type HeaderMap } from '../core/headers';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import type { ResequencerMetrics } from '../observability/resequencer.metrics';
import type { HandOffItem, ResequencedEntry } from '../ports/resequencer-store.port';
import type { Transport } from '../ports/transport.port';
import { callHandlerWithRetry } from '../sequence/handler-retry';
import { publishWithRetry } from '../sequence/publish-with-retry';
import { errorMessage } from '../sequence/sequence-delivery';
import type { PublishRetryOptions } from '../sequence.options';
import type { GapEvent } from './gap-event';
import type { ResolvedResequencer } from './resequencer.options';
import { ResequencedEvent, ResequenceHeader } from './resequenced-event';

/** What a resequencer's released events are handed to. */
export interface HandOffTargets {
  readonly definition: ResolvedResequencer;
  /** The decorated method (or the service user's handler); absent when only `output` is used. */
  readonly handler?: (event: ResequencedEvent) => unknown;
  readonly transport: Transport;
  readonly publish: Required<PublishRetryOptions>;
  readonly metrics: ResequencerMetrics;
  readonly logger: Logger;
  /** Reports a gap outcome to the listeners (never throws). */
  readonly reportGap: (event: GapEvent) => Promise<void>;
}

/**
 * Delivers one hand-off item: an event to the output channel (confirmed) and/or the handler;
 * a gap record or a dead-lettered event to the dead-letter channel. Answers false when the broker
 * could not take a message after the publish retries: the drainer then stops, leaving the item
 * (and everything after it) in the hand-off list for a later attempt — nothing skipped, nothing
 * reordered. A handler that keeps failing does not block the key: its event is dead-lettered
 * (`handler-failed`) and the key moves on.
 */
export class HandOffDeliverer {
  constructor(private readonly targets: HandOffTargets) {}

  async deliver(key: string, item: HandOffItem): Promise<boolean> {
    const { definition } = this.targets;
    const resequencer = definition.name;
    switch (item.kind) {
      case 'event':
        return this.deliverEvent(key, item.entry);
      case 'dead-letter': {
        const detail =
          `key ${key}: event ${item.entry.seq} was buffered while ${item.expected} stayed missing ` +
          `past gap.timeoutMs (${definition.gap.timeoutMs} ms); moved out unreleased`;
        const ok = await this.deadLetter(key, item.entry, 'resequencer-gap-dead-letter', detail);
        if (ok) {
          this.targets.metrics.gap(resequencer, 'dead-lettered');
          await this.targets.reportGap({
            type: 'dead-lettered',
            resequencer,
            key,
            seq: item.entry.seq,
            expected: item.expected,
          });
        }
        return ok;
      }
      case 'gap-alert': {
        const event: GapEvent = {
          type: 'alert',
          resequencer,
          key,
          expected: item.expected,
          buffered: item.buffered,
          gapSince: item.gapSince,
        };
        const detail =
          `key ${key} has waited for ${item.expected} since ${new Date(item.gapSince).toISOString()} ` +
          `with ${item.buffered} event(s) buffered behind it; still waiting`;
        return this.record(event, 'resequencer-gap-alert', detail);
      }
      case 'gap-skipped': {
        const event: GapEvent = { type: 'skipped', resequencer, key, from: item.from, to: item.to };
        const range = item.from === item.to ? `${item.from}` : `${item.from}-${item.to}`;
        const detail = `key ${key}: gave up waiting for ${range}; later events were released`;
        return this.record(event, 'resequencer-gap-skipped', detail);
      }
    }
  }

  private async deliverEvent(key: string, entry: ResequencedEntry): Promise<boolean> {
    const { definition, metrics } = this.targets;
    if (definition.output !== undefined) {
      const published = await this.publish(
        definition.output,
        entry.body,
        outputHeaders(key, entry),
      );
      if (!published) return false;
    }
    if (definition.callHandler && this.targets.handler) {
      const handler = this.targets.handler;
      const event = new ResequencedEvent(key, entry.seq, entry.body, entry.headers);
      let final = false;
      const outcome = await callHandlerWithRetry(() => handler(event), definition.handlerRetry, {
        onFailure: (error, attempt) => {
          // Bytes that fail their check cannot get better by calling the handler again.
          final = error instanceof SequenceIntegrityError;
          if (final) return;
          metrics.handlerFailed(definition.name);
          this.targets.logger.warn(
            `handler of ${definition.name} failed on key ${key}, event ${entry.seq} ` +
              `(attempt ${attempt} of ${definition.handlerRetry.attempts}): ${errorMessage(error)}`,
          );
        },
        isFinal: () => final,
      });
      if (!outcome.ok && outcome.error instanceof SequenceIntegrityError) {
        return this.deadLetter(key, entry, 'integrity-mismatch', outcome.error.message);
      }
      if (!outcome.ok) {
        const detail =
          `key ${key}, event ${entry.seq}: handler failed ${outcome.attempts} time(s); ` +
          `last error: ${errorMessage(outcome.error)}; the key moved on`;
        return this.deadLetter(key, entry, 'handler-failed', detail);
      }
    }
    metrics.delivered(definition.name);
    return true;
  }

  private async deadLetter(
    key: string,
    entry: ResequencedEntry,
    code: RejectionCode,
    detail: string,
  ): Promise<boolean> {
    const { definition, metrics, logger } = this.targets;
    metrics.deadLettered(definition.name, code);
    logger.warn(`${definition.name}: dead-lettered: ${deathReason(code, detail)}`);
    return this.publish(definition.deadLetterChannel, entry.body, {
      ...outputHeaders(key, entry),
      [SequenceHeader.deathReason]: deathReason(code, detail),
    });
  }

  /** A gap outcome: a JSON record on the dead-letter channel, a metric, the listeners. */
  private async record(event: GapEvent, code: RejectionCode, detail: string): Promise<boolean> {
    const { definition, metrics, logger } = this.targets;
    logger.warn(`${definition.name}: ${deathReason(code, detail)}`);
    const body = Buffer.from(JSON.stringify({ kind: code, ...event }));
    const ok = await this.publish(definition.deadLetterChannel, body, {
      [SequenceHeader.deathReason]: deathReason(code, detail),
      [ResequenceHeader.key]: event.key,
      [SequenceHeader.contentType]: 'application/json',
    });
    if (!ok) return false;
    metrics.gap(definition.name, event.type);
    await this.targets.reportGap(event);
    return true;
  }

  private async publish(channel: string, body: Buffer, headers: HeaderMap): Promise<boolean> {
    const outcome = await publishWithRetry(
      this.targets.transport,
      channel,
      body,
      headers,
      this.targets.publish,
    );
    if (outcome.ok) return true;
    this.targets.logger.warn(
      `${this.targets.definition.name}: could not publish to ${channel} after ` +
        `${outcome.attempts} attempt(s); the key's hand-off waits for the next drain: ` +
        errorMessage(outcome.error),
    );
    return false;
  }
}

/** The event's own headers, plus its key and sequence (a `key`/`seq` function may have read them from the body). */
function outputHeaders(key: string, entry: ResequencedEntry): HeaderMap {
  return { ...entry.headers, [ResequenceHeader.key]: key, [ResequenceHeader.seq]: entry.seq };
}
