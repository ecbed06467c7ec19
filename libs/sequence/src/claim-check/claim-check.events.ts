import type { SequenceEvents } from '../kernel/lifecycle-events';
import { audienceChannel, type ClaimTicket } from '../core/claim-ticket';

/** Why a payload was deleted, as `claim.deleted` says. */
export type ClaimDeletion = 'consumed' | 'expired' | 'orphaned' | 'released' | 'publish-failed';

/**
 * Claim Check's lifecycle events, one method per emission point: each returns at once when
 * nothing listens. `channel` is the ticket's first audience channel (the consumer's, on check-out).
 */
export class ClaimCheckLifecycle {
  constructor(readonly events: SequenceEvents) {}

  /** `Date.now()` while something listens, else 0: for timings only an event carries. */
  clock(): number {
    return this.events.listening ? Date.now() : 0;
  }

  checkedIn(ticket: ClaimTicket, audience: readonly string[], startedAt: number): void {
    if (!this.events.listeningTo('claim.checked-in')) return;
    const at = Date.now();
    this.events.emit(() => ({
      type: 'claim.checked-in',
      at,
      channel: audienceChannel(audience[0] ?? ''),
      ref: ticket.ref,
      store: ticket.store,
      bytes: ticket.bytes,
      sha256: ticket.sha256,
      expiresAt: ticket.expiresAt,
      audience: [...audience],
      durationMs: startedAt > 0 ? Math.max(0, at - startedAt) : 0,
    }));
  }

  checkedOut(channel: string, ticket: ClaimTicket, startedAt: number): void {
    if (!this.events.listeningTo('claim.checked-out')) return;
    const at = Date.now();
    this.events.emit(() => ({
      type: 'claim.checked-out',
      at,
      channel,
      ref: ticket.ref,
      store: ticket.store,
      bytes: ticket.bytes,
      durationMs: startedAt > 0 ? Math.max(0, at - startedAt) : 0,
    }));
  }

  deleted(channel: string, store: string, ref: string, reason: ClaimDeletion): void {
    if (!this.events.listeningTo('claim.deleted')) return;
    this.events.emit(() => ({
      type: 'claim.deleted',
      at: Date.now(),
      channel,
      ref,
      store,
      reason,
    }));
  }
}
