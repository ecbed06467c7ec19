import type { ClaimTicket } from '../core/claim-ticket';
import type { Disposition, InboundMessage } from '../ports/transport.port';
import type { ResolvedTracing } from '../options/resolved-options';
import {
  carriedParent,
  inSpan,
  messagingAttributes,
  type TraceSpan,
} from '../kernel/tracing/message-spans';

/**
 * Claim Check's spans: `send <channel>` per `publish()` (producer; its ticket, inline message or
 * sequence carries its context), `check-in` while a payload is stored, `check-out` while a ticket's
 * payload is read and handled (linked to the producer's span), and `process <channel>` for an
 * inline payload's handler.
 */
export class ClaimCheckTracing {
  constructor(private readonly tracing: ResolvedTracing) {}

  send<T>(channel: string, work: (span: TraceSpan) => Promise<T>): Promise<T> {
    return inSpan(
      this.tracing,
      {
        name: `send ${channel}`,
        kind: 'producer',
        attributes: messagingAttributes({ operation: 'send', destination: channel }),
      },
      work,
    );
  }

  checkIn(work: () => Promise<ClaimTicket>): Promise<ClaimTicket> {
    return inSpan(
      this.tracing,
      { name: 'check-in', kind: 'internal', attributes: { 'messaging.system': 'nest-sequence' } },
      async (span) => {
        const ticket = await work();
        span.set(ticketAttributes(ticket));
        return ticket;
      },
    );
  }

  /** `check-out`: a ticket received on `channel` (or handed to `checkOut()`), and its handling. */
  checkOut<T>(
    channel: string | undefined,
    ticket: ClaimTicket,
    headers: Readonly<Record<string, unknown>>,
    work: () => Promise<T>,
  ): Promise<T> {
    return inSpan(
      this.tracing,
      {
        name: 'check-out',
        kind: 'consumer',
        parent: carriedParent(this.tracing),
        carriers: [headers],
        attributes: {
          ...messagingAttributes({
            operation: 'process',
            destination: channel,
            messageId: `${ticket.store}:${ticket.ref}`,
            bodyBytes: ticket.bytes,
          }),
          ...ticketAttributes(ticket),
        },
      },
      () => work(),
    );
  }

  /** `process <channel>` of an inline payload. */
  inline(message: InboundMessage, work: () => Promise<Disposition>): Promise<Disposition> {
    return inSpan(
      this.tracing,
      {
        name: `process ${message.channel}`,
        kind: 'consumer',
        parent: carriedParent(this.tracing),
        carriers: [message.headers ?? {}],
        attributes: messagingAttributes({
          operation: 'process',
          destination: message.channel,
          bodyBytes: message.body?.length,
        }),
      },
      () => work(),
    );
  }
}

function ticketAttributes(ticket: ClaimTicket): Record<string, string | number> {
  return {
    'nest_sequence.claim_check.ref': `${ticket.store}:${ticket.ref}`,
    'nest_sequence.claim_check.bytes': ticket.bytes,
  };
}
