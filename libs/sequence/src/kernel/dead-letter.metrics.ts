import { Injectable } from '@nestjs/common';
import type { Counter } from 'prom-client';
import { splitDeathReason, type RejectionCode } from '../core/errors/rejection-code';
import { ModuleMetrics } from './module-metrics';

/**
 * Every code an `x-death-reason` of the module starts with. A reason that starts with none of
 * them (a handler of the application dead-lettering with words of its own) is counted as
 * `other`, so that the metric's label values stay a short, known list.
 */
const REJECTION_CODES = [
  'malformed-header',
  'unsupported-version',
  'crc-mismatch',
  'fragment-too-large',
  'headers-too-large',
  'position-out-of-range',
  'size-changed',
  'duplicate-last',
  'conflicting-duplicate',
  'declaration-changed',
  'sequence-too-large',
  'too-many-fragments',
  'integrity-mismatch',
  'sequence-rejected',
  'sequence-expired',
  'handler-failed',
  'handler-timeout',
  'claim-ticket-invalid',
  'wrong-audience',
  'unknown-payload-store',
  'claim-check-not-found',
  'store-unavailable',
  'invalid-resequence-event',
  'resequencer-buffer-full',
  'resequencer-gap-alert',
  'resequencer-gap-skipped',
  'resequencer-gap-dead-letter',
  'resequencer-output-unsendable',
  'invalid-inbox-message',
  'no-inbox-handler',
  'no-handler',
  'undecodable',
  'forbidden',
  'invalid-payload',
] as const satisfies readonly RejectionCode[];

// Fails to compile when a code is added to RejectionCode and not to the list above.
const everyCodeListed: [Exclude<RejectionCode, (typeof REJECTION_CODES)[number]>] extends [never]
  ? true
  : never = true;
void everyCodeListed;

/**
 * Codes of the dead letters a transport stores on its own (`Transport.onDeadLetter`): NATS
 * JetStream's `max-deliver`, a message requeued or left unsettled up to its `max_deliver`.
 */
const TRANSPORT_CODES = ['max-deliver'] as const;
export type TransportDeathCode = (typeof TRANSPORT_CODES)[number];

const KNOWN_CODES: ReadonlySet<string> = new Set([...REJECTION_CODES, ...TRANSPORT_CODES]);

/** The `reason` label of a dead letter: its reason's code (before the first `:`), or `other`. */
export function deadLetterReasonLabel(
  reason: string,
): RejectionCode | TransportDeathCode | 'other' {
  const { code } = splitDeathReason(reason);
  return KNOWN_CODES.has(code) ? (code as RejectionCode | TransportDeathCode) : 'other';
}

/**
 * `nest_sequence_dead_letters_total{channel,reason}`: the dead letters the module sent, of every
 * pattern. `channel` is the channel whose message it was (the input channel, not the dead-letter
 * channel), `reason` the code of its `x-death-reason` ({@link deadLetterReasonLabel}).
 *
 * Two paths lead there, and each counts in one place: the dead-letter dispositions of the
 * module's subscriptions (counted by the consumer host as it hands them to the transport, unless
 * the delivery was abandoned by then: the transport ignores that verdict), and
 * the records the module publishes to a dead-letter channel itself (an expired sequence, a
 * resequencer's gap outcome or dead-lettered event), counted once the broker confirmed them.
 */
@Injectable()
export class DeadLetterMetrics {
  private readonly sent: Counter<'channel' | 'reason'>;

  constructor(metrics: ModuleMetrics) {
    this.sent = metrics.counter(
      'dead_letters_total',
      'Dead letters the module sent, every pattern, by input channel and reason code',
      ['channel', 'reason'],
    );
  }

  /**
   * One dead letter of a message of `channel`, `reason` its `x-death-reason`: given by a
   * subscription of the module, published by the module, or stored by the transport on its own.
   */
  deadLettered(channel: string, reason: string): void {
    this.sent.inc({ channel, reason: deadLetterReasonLabel(reason) });
  }
}
