import type { ResolvedTracing } from '../options/resolved-options';
import { ResequencerTracing } from './resequencer.tracing';
import { ResequenceHeader } from '../core/resequence-input';
import type { Logger } from '@nestjs/common';
import { SequenceHeader, type HeaderMap } from '../core/headers';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import type { ResequencerMetrics } from './resequencer.metrics';
import type { HandOffItem, ResequencedEntry } from '../ports/resequencer-store.port';
import { assertSendable, isUnsendable, type Transport } from '../ports/transport.port';
import type { HandlerContext, HandlerTimeLimit } from '../kernel/handler-call';
import { callHandlerWithRetry, handlerRejection } from '../kernel/handler-retry';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import { StoredFragmentIntegrityError } from '../core/errors/stored-fragment-integrity.error';
import type { AbandonedCalls } from '../kernel/abandoned-calls';
import {
  mayHaveReachedTheBroker,
  publishOnce,
  publishWithRetry,
  type PublishOutcome,
} from '../kernel/publish-with-retry';
import { errorMessage } from '../core/errors/caught';
import type { GapEvent } from '../core/gap-event';
import type { ResolvedPublishPolicy, ResolvedResequencer } from '../options/resolved-options';
import { ResequencedEvent } from './resequenced-event';

/** What a resequencer's released events are handed to. */
export interface HandOffTargets {
  readonly definition: ResolvedResequencer;
  /** The decorated method (or the service user's handler); absent when only `output` is used. */
  readonly handler?: (event: ResequencedEvent, context: HandlerContext) => unknown;
  /** This process's handler calls that ran past `handlerTimeoutMs` and still run. */
  readonly abandoned: AbandonedCalls;
  readonly transport: Transport;
  readonly publish: ResolvedPublishPolicy;
  readonly metrics: ResequencerMetrics;
  readonly logger: Logger;
  /** Reports a gap outcome to the listeners (never throws). */
  readonly reportGap: (event: GapEvent) => Promise<void>;
  /** The module's `tracing`; none: no spans. */
  readonly tracing?: ResolvedTracing;
  /**
   * Aborted at shutdown, once deliveries in progress had their time: no handler call or publish
   * (to the output or the dead-letter channel, a retry included) starts after it, its item left
   * in the hand-off list for the key's next drain.
   */
  readonly stop?: AbortSignal;
}

const TRACING_OFF: ResolvedTracing = { enabled: false, parent: 'link', maxLinks: 0 };

/**
 * What the drain lease still allows, asked before each publish attempt and each handler retry:
 * whether an attempt that may take `ms` milliseconds ends before the lease could pass to another
 * instance. An attempt begun too late could deliver an event after the next holder has delivered
 * later ones.
 */
export interface DeliveryGuard {
  allows(ms: number): boolean;
}

const UNGUARDED: DeliveryGuard = { allows: () => true };

/**
 * Delivers one hand-off item: an event to the output channel (confirmed) and/or the handler;
 * a gap record or a dead-lettered event to the dead-letter channel. Answers false when the broker
 * could not take a message after the publish retries, when the lease leaves no time for another
 * attempt, or once the module is stopping: the drainer then stops, leaving the item (and
 * everything after it) in the hand-off list for a later attempt — nothing skipped, nothing
 * reordered. Neither a handler that keeps failing nor an event the transport can never send to
 * `output` blocks the key: the event is dead-lettered (`handler-failed`,
 * `resequencer-output-unsendable`) and the key moves on.
 */
export class HandOffDeliverer {
  private readonly traces: ResequencerTracing;

  constructor(private readonly targets: HandOffTargets) {
    this.traces = new ResequencerTracing(targets.tracing ?? TRACING_OFF, targets.definition.name);
  }

  /**
   * Delivers `items[from]` and, with `outputInFlight` above 1, the events right after it, with up
   * to that many publishes awaiting their confirms at once (sent in order, each at most once).
   * Answers how many items from `from` on were delivered, in order; 0 means stop, as `deliver`
   * answering false. When a publish of the window fails, the ones confirmed before it count and
   * the next call starts from it; a window whose first publish fails sends that event alone,
   * with `deliver`'s retries. Ones after it that the broker confirmed all the same reach the
   * output again (at least once, as after a crash).
   */
  async deliverFrom(
    key: string,
    items: readonly HandOffItem[],
    from: number,
    guard: DeliveryGuard = UNGUARDED,
  ): Promise<number> {
    const window = this.windowOf(key, items, from);
    if (window.length <= 1) return (await this.deliver(key, items[from], guard)) ? 1 : 0;
    const { definition, transport, publish, metrics, logger } = this.targets;
    const output = definition.output as string;
    const timeoutMs = publish.confirmTimeoutMs;
    if (this.stopping()) return 0;
    const sent: Promise<void>[] = [];
    for (const { entry, headers } of window) {
      // Each publish must be confirmed before the lease could pass on, as in `deliver`.
      if (!guard.allows(timeoutMs)) break;
      sent.push(
        this.traces.release(key, entry, () =>
          publishOnce(transport, output, entry.body, headers, { timeoutMs, resend: false }),
        ),
      );
    }
    if (sent.length === 0) {
      logger.warn(
        `${definition.name}: key ${key}: no publish of event ${window[0].entry.seq} to ${output}: ` +
          `its confirm could come after the drain lease may have passed on (leaseMs)`,
      );
      return 0;
    }
    const results = await Promise.allSettled(sent);
    let confirmed = 0;
    while (confirmed < results.length && results[confirmed].status === 'fulfilled') confirmed++;
    if (confirmed > 0) metrics.delivered(definition.name, confirmed);
    if (confirmed === results.length) return confirmed;

    const failure = (results[confirmed] as PromiseRejectedResult).reason as unknown;
    const seq = window[confirmed].entry.seq;
    // What outputInFlight above 1 cannot rule out: a failed publish overtaken by a later one of
    // the key. That is any failure before a later confirm (a refusal certainly left the later
    // event on the output first; a confirm that did not come in time may have been for a message
    // the transport gave up unsent), and a failure that kept the message from the broker (a
    // refusal, or given up before it was handed over) before a later publish that may have
    // reached it (its confirm timed out). Two publishes that may both have reached the broker
    // (a dropped connection fails every unconfirmed one) went out on one channel in order.
    const states = results.map((result) =>
      result.status === 'fulfilled'
        ? 'confirmed'
        : mayHaveReachedTheBroker(result.reason)
          ? 'maybe'
          : 'absent',
    );
    const lastConfirmed = states.lastIndexOf('confirmed');
    const lastMaybe = states.lastIndexOf('maybe');
    const overtaken = window
      .slice(0, results.length)
      .filter(
        (_, i) =>
          states[i] !== 'confirmed' &&
          (i < lastConfirmed || (states[i] === 'absent' && i < lastMaybe)),
      )
      .map(({ entry }) => entry.seq);
    if (overtaken.length > 0) {
      metrics.outputOrderAtRisk(definition.name, overtaken.length);
      logger.error(
        `${definition.name}: key ${key}: event(s) ${overtaken.join(', ')} to ${output} failed ` +
          `while later ones sent with them were confirmed or may have reached the broker ` +
          `(outputInFlight ${definition.outputInFlight}): the output may hold those first; ` +
          `sending again from event ${seq}: ${errorMessage(failure)}`,
      );
    } else {
      logger.warn(
        `${definition.name}: key ${key}: event ${seq} to ${output} was not confirmed; sending ` +
          `again from it: ${errorMessage(failure)}`,
      );
    }
    if (confirmed > 0) return confirmed;
    return (await this.deliver(key, items[from], guard)) ? 1 : 0;
  }

  /**
   * The events a window may publish from `from` on, with their output headers: consecutive events
   * (not gap records or dead-letters), up to `outputInFlight`, each passing the checks the
   * transport makes before it sends (`assertSendable`), so that none fails for a reason no retry
   * can change.
   */
  private windowOf(
    key: string,
    items: readonly HandOffItem[],
    from: number,
  ): Array<{ entry: ResequencedEntry; headers: HeaderMap }> {
    const { definition, transport } = this.targets;
    const window: Array<{ entry: ResequencedEntry; headers: HeaderMap }> = [];
    const inFlight = definition.outputInFlight ?? 1;
    if (inFlight <= 1 || definition.output === undefined) return window;
    if (definition.callHandler && this.targets.handler) return window;
    for (let i = from; i < items.length && window.length < inFlight; i++) {
      const item = items[i];
      if (item.kind !== 'event') break;
      const headers = outputHeaders(key, item.entry);
      try {
        assertSendable(definition.output, item.entry.body, headers, transport.maxMessageBytes);
      } catch {
        break;
      }
      window.push({ entry: item.entry, headers });
    }
    return window;
  }

  async deliver(
    key: string,
    item: HandOffItem,
    guard: DeliveryGuard = UNGUARDED,
  ): Promise<boolean> {
    const { definition } = this.targets;
    const resequencer = definition.name;
    switch (item.kind) {
      case 'event':
        return this.traces.release(key, item.entry, () =>
          this.deliverEvent(key, item.entry, guard),
        );
      case 'dead-letter': {
        // Under any other policy, only the sweep of keys close to retention moves events out.
        const why =
          definition.gap.policy === 'dead-letter'
            ? `past gap.timeoutMs (${definition.gap.timeoutMs} ms)`
            : "with no change to the key for nine tenths of the store's retention";
        const detail =
          `key ${key}: event ${item.entry.seq} was buffered while ${item.expected} stayed missing ` +
          `${why}; moved out unreleased`;
        const ok = await this.moveOut(
          key,
          item.entry,
          'resequencer-gap-dead-letter',
          detail,
          guard,
        );
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
        return this.record(event, 'resequencer-gap-alert', detail, guard);
      }
      case 'gap-skipped': {
        const event: GapEvent = { type: 'skipped', resequencer, key, from: item.from, to: item.to };
        const range = item.from === item.to ? `${item.from}` : `${item.from}-${item.to}`;
        const detail = `key ${key}: gave up waiting for ${range}; later events were released`;
        return this.record(event, 'resequencer-gap-skipped', detail, guard);
      }
      case 'undecryptable': {
        // Its bytes cannot be trusted, or read: the dead letter carries the reason only.
        const entry: ResequencedEntry = { seq: item.seq, body: Buffer.alloc(0), headers: {} };
        return this.moveOut(key, entry, 'integrity-mismatch', item.detail, guard);
      }
    }
  }

  private async deliverEvent(
    key: string,
    entry: ResequencedEntry,
    guard: DeliveryGuard,
  ): Promise<boolean> {
    const { definition, metrics } = this.targets;
    if (definition.output !== undefined) {
      const outcome = await this.publish(
        definition.output,
        entry.body,
        outputHeaders(key, entry),
        guard,
      );
      if (!outcome.ok && isUnsendable(outcome.error)) {
        // No retry can send it: waiting would hold every later event of the key behind it.
        const detail =
          `key ${key}, event ${entry.seq}: the transport cannot send it to ${definition.output} ` +
          `(${errorMessage(outcome.error)}); the key moved on`;
        return this.moveOut(key, entry, 'resequencer-output-unsendable', detail, guard);
      }
      if (!outcome.ok) return false;
    }
    if (definition.callHandler && this.targets.handler) {
      const handler = this.targets.handler;
      const headers = ResequencerTracing.delivered(entry.headers);
      let final = false;
      let leaseEnding = false;
      const call = (context: HandlerContext) => {
        // Asked before every call, the first included (a retry's backoff, or the wait for an
        // abandoned call, may have taken the lease's last moments): the next holder may be
        // calling it with later events.
        if (!guard.allows(0)) {
          leaseEnding = true;
          throw new Error('the drain lease may lapse: no further call');
        }
        // A body of its own per call: a handler that changes it in place, then fails, must not
        // hand its retry the changed bytes.
        const body = Buffer.from(entry.body);
        return handler(new ResequencedEvent(key, entry.seq, body, headers), context);
      };
      const outcome = await callHandlerWithRetry(call, definition.handlerRetry, {
        limit: this.limitOf(key, entry.seq),
        // Untimed: a call abandoned on this key (this event's, or an earlier one's) must have
        // returned before the next begins.
        beforeCall: () => this.targets.abandoned.settled(key),
        onFailure: (error, attempt) => {
          if (leaseEnding) return;
          // Bytes that fail their check cannot get better by calling the handler again.
          final = isIntegrityFailure(error);
          if (final) return;
          metrics.handlerFailed(definition.name);
          this.targets.logger.warn(
            `handler of ${definition.name} failed on key ${key}, event ${entry.seq} ` +
              `(attempt ${attempt} of ${definition.handlerRetry.attempts}): ${errorMessage(error)}`,
          );
        },
        isFinal: () => final || leaseEnding,
        stop: this.targets.stop,
      });
      if (!outcome.ok && (leaseEnding || outcome.stopped)) return false;
      if (!outcome.ok && isIntegrityFailure(outcome.error)) {
        return this.deadLetter(key, entry, 'integrity-mismatch', outcome.error.message, guard);
      }
      if (!outcome.ok) {
        const { code, detail } = handlerRejection(`key ${key}, event ${entry.seq}`, outcome);
        const reason = `${detail}; the key moved on`;
        const ok = await this.deadLetter(key, entry, code, reason, guard);
        if (ok && outcome.error instanceof MessageRefusedError) {
          definition.refused?.(key, entry.seq, code, reason);
        }
        return ok;
      }
    }
    metrics.delivered(definition.name);
    return true;
  }

  /**
   * Whether the module is stopping (`stop`): no publish, its retries included, starts then, as no
   * handler call does (`callHandlerWithRetry`'s `stop`).
   */
  private stopping(): boolean {
    return this.targets.stop?.aborted === true;
  }

  /** The time limit of one handler call on `key`'s event `seq`. */
  private limitOf(key: string, seq: number): HandlerTimeLimit {
    const { definition, logger, abandoned } = this.targets;
    const ms = definition.handlerTimeoutMs;
    const subject = `key ${key}, event ${seq}`;
    return {
      ms,
      error: (attempt) => new HandlerTimeoutError(definition.channel, subject, ms!, attempt),
      abandoned: (settled) => {
        abandoned.add(key, settled);
        logger.warn(
          `${definition.name}: the handler ran past handlerTimeoutMs (${ms} ms) on ${subject}; ` +
            'its AbortSignal is aborted, and the key waits until the call returns (two calls ' +
            'for one key never overlap): a handler that ignores the signal keeps the key blocked',
        );
        const abandonedAt = Date.now();
        void settled.then(() =>
          logger.log(
            `${definition.name}: the abandoned call on ${subject} returned ` +
              `${Date.now() - abandonedAt} ms after its time limit; the key moves on`,
          ),
        );
      },
    };
  }

  /**
   * {@link deadLetter} for an event the resequencer dead-letters itself, whatever the handler: the
   * definer hears of it once it is sent (`deadLettered`), since its handler never sees it.
   */
  private async moveOut(
    key: string,
    entry: ResequencedEntry,
    code: RejectionCode,
    detail: string,
    guard: DeliveryGuard,
  ): Promise<boolean> {
    const ok = await this.deadLetter(key, entry, code, detail, guard);
    if (ok) this.targets.definition.deadLettered?.(key, entry.seq, code, detail);
    return ok;
  }

  /**
   * The event, with its reason, on the dead-letter channel. When the transport cannot send even
   * that (the body too large with the added headers), a JSON record of the event without its
   * body goes instead: the key must not stay blocked behind it.
   */
  private async deadLetter(
    key: string,
    entry: ResequencedEntry,
    code: RejectionCode,
    detail: string,
    guard: DeliveryGuard,
  ): Promise<boolean> {
    const { definition, metrics, logger } = this.targets;
    const reason = deathReason(code, detail);
    const outcome = await this.publish(
      definition.deadLetterChannel,
      entry.body,
      { ...outputHeaders(key, entry), [SequenceHeader.deathReason]: reason },
      guard,
    );
    let ok = outcome.ok;
    if (!outcome.ok && isUnsendable(outcome.error)) {
      // As small as it can be: the details (the key among them) travel once, in the body.
      const record = {
        kind: code,
        key,
        seq: entry.seq,
        bytes: entry.body.length,
        bodyOmitted: true,
        reason,
      };
      ok = (
        await this.publish(
          definition.deadLetterChannel,
          Buffer.from(JSON.stringify(record)),
          {
            [SequenceHeader.deathReason]: deathReason(
              code,
              `event ${entry.seq}; its body (${entry.body.length} bytes) could not be sent either ` +
                'and is omitted; the reason and key are in this record',
            ),
            [ResequenceHeader.seq]: entry.seq,
            [SequenceHeader.contentType]: 'application/json',
          },
          guard,
        )
      ).ok;
    }
    if (!ok) return false;
    metrics.deadLettered(definition.name, code);
    metrics.deadLetterSent(definition.channel, reason);
    logger.warn(`${definition.name}: dead-lettered: ${reason}`);
    return true;
  }

  /** A gap outcome: a JSON record on the dead-letter channel, a metric, the listeners. */
  private async record(
    event: GapEvent,
    code: RejectionCode,
    detail: string,
    guard: DeliveryGuard,
  ): Promise<boolean> {
    const { definition, metrics, logger } = this.targets;
    logger.warn(`${definition.name}: ${deathReason(code, detail)}`);
    const body = Buffer.from(JSON.stringify({ kind: code, ...event }));
    const outcome = await this.publish(
      definition.deadLetterChannel,
      body,
      {
        [SequenceHeader.deathReason]: deathReason(code, detail),
        [ResequenceHeader.key]: event.key,
        [SequenceHeader.contentType]: 'application/json',
      },
      guard,
    );
    if (!outcome.ok) return false;
    metrics.gap(definition.name, event.type);
    metrics.deadLetterSent(definition.channel, code);
    await this.targets.reportGap(event);
    return true;
  }

  /**
   * Publishes with retries, each attempt only while the lease leaves time for its confirm and the
   * module is not stopping.
   */
  private async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    guard: DeliveryGuard,
  ): Promise<PublishOutcome> {
    const outcome = await publishWithRetry(
      this.targets.transport,
      channel,
      body,
      headers,
      this.targets.publish,
      (timeoutMs) => !this.stopping() && guard.allows(timeoutMs),
    );
    // Stopping, it is left for the key's next drain: nothing to warn of.
    if (!outcome.ok && !this.stopping()) {
      this.targets.logger.warn(
        `${this.targets.definition.name}: could not publish to ${channel} after ` +
          `${outcome.attempts} attempt(s): ${errorMessage(outcome.error)}`,
      );
    }
    return outcome;
  }
}

/** The event's own headers, plus its key and sequence (a `key`/`seq` function may have read them from the body). */
function outputHeaders(key: string, entry: ResequencedEntry): HeaderMap {
  const headers = ResequencerTracing.delivered(entry.headers);
  return { ...headers, [ResequenceHeader.key]: key, [ResequenceHeader.seq]: entry.seq };
}

/** Bytes that failed their check (the payload's, or a body's read back): final, no retry. */
function isIntegrityFailure(
  error: unknown,
): error is SequenceIntegrityError | StoredFragmentIntegrityError {
  return error instanceof SequenceIntegrityError || error instanceof StoredFragmentIntegrityError;
}
