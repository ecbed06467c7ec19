import { Injectable } from '@nestjs/common';
import {
  fragmentAudience,
  serializeTicket,
  ticketFragmentProblem,
  type ClaimTicket,
  type TicketFragment,
} from '../core/claim-ticket';
import { errorMessage } from '../core/errors/caught';
import { ClaimTicketAudienceError } from '../core/errors/claim-ticket-audience.error';
import { ClaimTicketInvalidError } from '../core/errors/claim-ticket-invalid.error';
import type { RejectionCode } from '../core/errors/rejection-code';
import { UnknownPayloadStoreError } from '../core/errors/unknown-payload-store.error';
import type { FragmentParking, ParkedFragment, TakenFragment } from '../kernel/pattern-contracts';
import { PayloadParking } from './payload-parking';
import { payloadReadRejection } from './payload-read-rejection';

interface ParkedFragmentTicket extends ParkedFragment {
  readonly ticket: ClaimTicket;
}

/**
 * Claim Check's side of fragments sent `via: 'claim-check'`: each body is parked in the payload
 * store under a ticket issued for the fragments of the fragment's channel (`fragment of
 * <channel>`: unpublished until its message is confirmed, like any `publish()`), and the consumer
 * of that channel takes it back, checked, before storing the fragment. Its audience keeps it from
 * passing for a whole payload's ticket there, and a whole payload's ticket for a fragment's; the
 * sequence id and position signed into it keep it from passing for another fragment's body.
 */
@Injectable()
export class ClaimCheckFragmentParking implements FragmentParking {
  constructor(private readonly parking: PayloadParking) {}

  async park(
    body: Buffer,
    channel: string,
    fragment: TicketFragment,
  ): Promise<ParkedFragmentTicket> {
    const ticket = await this.parking.park(body, {}, false, [fragmentAudience(channel)], fragment);
    return { ticket, ticketBody: serializeTicket(ticket) };
  }

  settle(parked: ParkedFragment, published: boolean): Promise<void> {
    return this.parking.settle((parked as ParkedFragmentTicket).ticket, published);
  }

  async take(
    ticketBody: Buffer,
    channel: string,
    fragment: TicketFragment,
    maxBytes: number,
  ): Promise<TakenFragment | { refused: RejectionCode; detail: string; expiredOnly?: true }> {
    try {
      const parked = this.parking.resolveOn(fragmentAudience(channel), ticketBody);
      // Another fragment's ticket under these headers: refused before its payload is read.
      const copied = ticketFragmentProblem(parked.ticket, fragment);
      if (copied !== undefined) return { refused: 'wrong-audience', detail: copied };
      if (parked.ticket.bytes > maxBytes) {
        return {
          refused: 'fragment-too-large',
          detail: `${parked.ticket.bytes}-byte parked body exceeds maxFragmentBytes (${maxBytes})`,
        };
      }
      const body = await this.parking.readWhole(parked, channel);
      return { body, release: () => this.parking.releaseParked(parked) };
    } catch (error) {
      const refused = refusal(error);
      if (!refused) throw error;
      const detail = errorMessage(error);
      return this.expiredOnly(error, ticketBody, channel, fragment)
        ? { refused, detail, expiredOnly: true }
        : { refused, detail };
    }
  }

  /** Whether `error` refused a ticket that passes every other check on `channel` as `fragment`. */
  private expiredOnly(
    error: unknown,
    ticketBody: Buffer,
    channel: string,
    fragment: TicketFragment,
  ): boolean {
    if (!(error instanceof ClaimTicketInvalidError) || error.reason !== 'expired') return false;
    try {
      const parked = this.parking.resolveExpiredOn(fragmentAudience(channel), ticketBody);
      return ticketFragmentProblem(parked.ticket, fragment) === undefined;
    } catch {
      return false;
    }
  }
}

/** Why a parked fragment body is refused for good; undefined for a transient failure. */
function refusal(error: unknown): RejectionCode | undefined {
  if (error instanceof ClaimTicketInvalidError) return 'claim-ticket-invalid';
  if (error instanceof ClaimTicketAudienceError) return 'wrong-audience';
  if (error instanceof UnknownPayloadStoreError) return 'unknown-payload-store';
  return payloadReadRejection(error);
}
