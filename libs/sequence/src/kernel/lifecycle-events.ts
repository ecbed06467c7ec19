import { AsyncResource } from 'node:async_hooks';
import { Injectable, Logger } from '@nestjs/common';
import type { Observable } from 'rxjs';
import { errorMessage } from '../core/errors/caught';
import { GuardedObservable } from './guarded-observable';

/**
 * What every lifecycle event carries: its type, when it happened (ms since the epoch), and the
 * channel it concerns.
 */
export interface LifecycleEventBase<T extends string> {
  readonly type: T;
  readonly at: number;
  readonly channel: string;
}

/** Message Sequence: one sequence's life, and each fragment's fate. */
export type SequenceLifecycleEvent =
  | (LifecycleEventBase<'sequence.started'> & {
      readonly sequenceId: string;
      /** Declared fragments (`x-sequence-size`) and bytes, when the first fragment stored carries them. */
      readonly fragments?: number;
      readonly bytes?: number;
    })
  | (LifecycleEventBase<'sequence.completed'> & {
      readonly sequenceId: string;
      readonly fragments: number;
      readonly bytes: number;
      /** From the first fragment stored (stream mode: delivered) to the handler's success. */
      readonly durationMs: number;
      /** Handler calls it took (1 when the first succeeded). */
      readonly attempts: number;
    })
  | (LifecycleEventBase<'sequence.expired'> & {
      readonly sequenceId: string;
      readonly receivedFragments: number;
      /** Positions known missing (up to the declared size, else up to the highest received). */
      readonly missingFragments: number;
      /** Declared fragments, when known. */
      readonly fragments?: number;
      /** Budget bytes it held. */
      readonly bytes: number;
      /** From its first fragment to the expiry. */
      readonly ageMs: number;
    })
  | (LifecycleEventBase<'sequence.rejected'> & {
      readonly sequenceId: string;
      /** The rejection code: `sequence-too-large`, `integrity-mismatch`, … (docs/events.md). */
      readonly reason: string;
      readonly detail: string;
    })
  | (LifecycleEventBase<'sequence.failed'> & {
      readonly sequenceId: string;
      /** `handler-failed`, `handler-timeout`, or the code of the `MessageRefusedError` it threw. */
      readonly reason: string;
      readonly detail: string;
      readonly attempts: number;
    })
  | (LifecycleEventBase<'fragment.accepted'> & {
      readonly sequenceId: string;
      readonly position: number;
      readonly bytes: number;
      readonly last: boolean;
    })
  | (LifecycleEventBase<'fragment.duplicate'> & {
      readonly sequenceId: string;
      readonly position: number;
    })
  | (LifecycleEventBase<'fragment.rejected'> & {
      /** Absent when the headers could not be read. */
      readonly sequenceId?: string;
      readonly position?: number;
      /** The rejection code, as in the dead letter's `x-death-reason` before `:`. */
      readonly reason: string;
      readonly detail: string;
    });

/** Claim Check: a ticket's life. `channel` is the ticket's first audience channel, or `''`. */
export type ClaimCheckLifecycleEvent =
  | (LifecycleEventBase<'claim.checked-in'> & {
      readonly ref: string;
      readonly store: string;
      readonly bytes: number;
      readonly sha256: string;
      readonly expiresAt: number;
      /** The channels the ticket is signed for. */
      readonly audience: readonly string[];
      /** How long the payload took to stream into the store. */
      readonly durationMs: number;
    })
  | (LifecycleEventBase<'claim.checked-out'> & {
      readonly ref: string;
      readonly store: string;
      readonly bytes: number;
      /**
       * The read of a parked fragment body, or, for a `@ClaimCheck` handler, the handler's run
       * (its retries included); for `ClaimCheckService.checkOut`, the ticket's check and the
       * store's lookup (its caller reads the payload later).
       */
      readonly durationMs: number;
    })
  | (LifecycleEventBase<'claim.deleted'> & {
      readonly ref: string;
      readonly store: string;
      /** `consumed`, `expired`, `orphaned`, `released` or `publish-failed`. */
      readonly reason: string;
    });

/** Resequencer: gaps in a key's sequence numbers. `channel` is the resequencer's input channel. */
export type ResequencerLifecycleEvent =
  | (LifecycleEventBase<'gap.opened'> & {
      readonly resequencer: string;
      readonly key: string;
      /** The sequence number the key waits for. */
      readonly expected: number;
      /** The event that arrived ahead of it. */
      readonly seq: number;
      /** Events held behind the gap. */
      readonly held: number;
    })
  | (LifecycleEventBase<'gap.closed'> & {
      readonly resequencer: string;
      readonly key: string;
      /** The sequence number whose arrival closed it. */
      readonly expected: number;
      /** Events released by it, itself included. */
      readonly released: number;
      /** Since the gap opened, when this instance saw it open. */
      readonly waitedMs?: number;
    })
  | (LifecycleEventBase<'gap.skipped'> & {
      readonly resequencer: string;
      readonly key: string;
      readonly from: number;
      readonly to: number;
      readonly waitedMs: number;
      readonly reason: string;
    })
  | (LifecycleEventBase<'gap.dead-lettered'> & {
      readonly resequencer: string;
      readonly key: string;
      readonly expected: number;
      /** Events held behind the gap, moved to the dead-letter channel unreleased. */
      readonly events: number;
      readonly waitedMs: number;
      readonly reason: string;
    });

/**
 * Outbox and inbox rows. `channel`: for the outbox, the first channel the row is routed to (`''`
 * when its route failed); for the inbox, the channel of its `@InboxHandler` (`''` when none).
 */
export type BoxLifecycleEvent =
  | (LifecycleEventBase<'outbox.published'> &
      BoxRow & {
        /** Every channel it went to. */
        readonly channels: readonly string[];
        /** From the commit to the broker's confirm. */
        readonly lagMs: number;
      })
  | (LifecycleEventBase<'outbox.retried'> & BoxRetry)
  | (LifecycleEventBase<'outbox.failed'> & BoxFailure)
  | (LifecycleEventBase<'inbox.retried'> & BoxRetry)
  | (LifecycleEventBase<'inbox.failed'> & BoxFailure)
  | (LifecycleEventBase<'inbox.handled'> &
      BoxRow & {
        /** From the message's arrival to its handling committed. */
        readonly lagMs: number;
      })
  | (LifecycleEventBase<'inbox.duplicate'> & {
      readonly id: string;
      readonly kind: 'event' | 'command';
      readonly messageType: string;
    });

/** A row's attempt failed; it is tried again at `nextAttemptAt`. */
export interface BoxRetry extends BoxRow {
  /** The error, as stored in the row's `last_error`. */
  readonly reason: string;
  readonly nextAttemptAt: number;
}

/** A row is `FAILED`: out of retries, or its error is one no retry can fix. */
export interface BoxFailure extends BoxRow {
  readonly reason: string;
}

/** The row an outbox or inbox event is about. */
export interface BoxRow {
  readonly id: string;
  readonly kind: 'event' | 'command';
  /** The message's `type`. */
  readonly messageType: string;
  /** Attempts made so far, this one included. */
  readonly attempts: number;
}

/** What an operator did through the admin API (nest-sequence/admin). */
export type AdminLifecycleEvent = LifecycleEventBase<'admin.action'> & {
  /** `dead-letter.replay`, `outbox.retry`, `gap.skip`, …: the route's action name. */
  readonly action: string;
  /** The ids the action addressed. */
  readonly targets: readonly string[];
  /** How many of them it changed: 0 when there was nothing left to do. */
  readonly changed: number;
  /** Who asked, as the app's guard put it on the request (`request.user`), when there is one. */
  readonly actor?: string;
  /** Why the action failed as a whole (the route answered an error), when it did. */
  readonly error?: string;
};

/** Every event the module emits, discriminated by `type`. */
export type LifecycleEvent =
  | SequenceLifecycleEvent
  | ClaimCheckLifecycleEvent
  | ResequencerLifecycleEvent
  | BoxLifecycleEvent
  | AdminLifecycleEvent;

export type LifecycleEventType = LifecycleEvent['type'];

type Listener = (event: LifecycleEvent) => void;

/**
 * The module's lifecycle events, for audit trails and dashboards: inject it and subscribe to
 * `events$` (or `of(type)`). Delivery is synchronous, on the path that did the work, best effort
 * and not durable (see docs/events.md). With nobody listening an emission costs one size check:
 * the event object is only built for a listener (most emission points ask for their own type).
 *
 * A subscriber cannot break the message path or the process: an error thrown by its `next` (or by
 * an operator piped from these observables) is logged, and the subscription goes on; an error
 * nobody handles is logged rather than rethrown by rxjs on a timer.
 *
 * @example
 * events.of('sequence.completed', 'sequence.failed').subscribe((event) => audit.write(event));
 */
@Injectable()
export class SequenceEvents {
  private readonly logger = new Logger('SequenceEvents');
  private readonly listeners = new Set<Listener>();
  /** Subscribers of `events$`, and of `of()` by type: what `listeningTo` consults. */
  private everyType = 0;
  private readonly byType = new Map<string, number>();

  /** Every event, as it happens. */
  readonly events$: Observable<LifecycleEvent> = this.observe(undefined, (event) => event);

  /** The events of one or more types, typed by them. */
  of<T extends LifecycleEventType>(
    ...types: T[]
  ): Observable<Extract<LifecycleEvent, { type: T }>> {
    const wanted = new Set<string>(types);
    return this.observe(wanted, (event) =>
      wanted.has(event.type) ? (event as Extract<LifecycleEvent, { type: T }>) : undefined,
    );
  }

  /** True while anything listens: callers skip measuring what only an event would carry. */
  get listening(): boolean {
    return this.listeners.size > 0;
  }

  /**
   * True while something listens to events of `type` (`events$`, or `of()` with that type):
   * emission points skip building events nobody asked for.
   */
  listeningTo(type: LifecycleEventType): boolean {
    return this.everyType > 0 || (this.byType.get(type) ?? 0) > 0;
  }

  /**
   * Emits the event `build` returns, calling it only when something listens. Never throws: a
   * listener's error is logged.
   */
  emit(build: () => LifecycleEvent): void {
    if (this.listeners.size === 0) return;
    let event: LifecycleEvent;
    try {
      event = build();
    } catch (error) {
      this.logger.error(`building a lifecycle event failed: ${errorMessage(error)}`);
      return;
    }
    for (const listener of [...this.listeners]) {
      try {
        listener(event);
      } catch (error) {
        this.logger.error(`a listener of ${event.type} threw: ${errorMessage(error)}`);
      }
    }
  }

  private observe<E extends LifecycleEvent>(
    types: ReadonlySet<string> | undefined,
    pick: (event: LifecycleEvent) => E | undefined,
  ): Observable<E> {
    return new GuardedObservable<E>(
      (error) =>
        this.logger.error(`a subscriber of the lifecycle events threw: ${errorMessage(error)}`),
      (subscriber) => {
        // Run in the async context of the subscription, not of the emitting work: a listener
        // that opens `OutboxService.transaction` from a relay's or inbox's claim must get a
        // transaction of its own, not join the claim's (which commits under it).
        const listener: Listener = AsyncResource.bind((event: LifecycleEvent) => {
          const picked = pick(event);
          if (picked !== undefined) subscriber.next(picked);
        });
        this.listeners.add(listener);
        this.count(types, 1);
        return () => {
          if (this.listeners.delete(listener)) this.count(types, -1);
        };
      },
    );
  }

  private count(types: ReadonlySet<string> | undefined, by: 1 | -1): void {
    if (!types) {
      this.everyType += by;
      return;
    }
    for (const type of types) {
      const count = (this.byType.get(type) ?? 0) + by;
      if (count > 0) this.byType.set(type, count);
      else this.byType.delete(type);
    }
  }
}
