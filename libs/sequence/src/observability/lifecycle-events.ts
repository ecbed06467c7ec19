import { Injectable, Logger } from '@nestjs/common';
import { Observable } from 'rxjs';
import { errorMessage } from '../core/errors/caught';

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
      /** Declared fragments and bytes, when the producer announced them. */
      readonly fragments?: number;
      readonly bytes?: number;
    })
  | (LifecycleEventBase<'sequence.completed'> & {
      readonly sequenceId: string;
      readonly fragments: number;
      readonly bytes: number;
      /** From the first fragment stored to the handler's success. */
      readonly durationMs: number;
    })
  | (LifecycleEventBase<'sequence.expired'> & {
      readonly sequenceId: string;
      readonly receivedFragments: number;
      readonly bytes: number;
    })
  | (LifecycleEventBase<'sequence.rejected'> & {
      readonly sequenceId: string;
      readonly reason: string;
    })
  | (LifecycleEventBase<'sequence.failed'> & {
      readonly sequenceId: string;
      readonly reason: string;
      readonly attempts: number;
    })
  | (LifecycleEventBase<'fragment.accepted'> & {
      readonly sequenceId: string;
      readonly position: number;
      readonly bytes: number;
    })
  | (LifecycleEventBase<'fragment.duplicate'> & {
      readonly sequenceId: string;
      readonly position: number;
    })
  | (LifecycleEventBase<'fragment.rejected'> & {
      readonly sequenceId?: string;
      readonly position?: number;
      readonly reason: string;
    });

/** Claim Check: a ticket's life. */
export type ClaimCheckLifecycleEvent =
  | (LifecycleEventBase<'claim.checked-in'> & {
      readonly ref: string;
      readonly store: string;
      readonly bytes: number;
    })
  | (LifecycleEventBase<'claim.checked-out'> & {
      readonly ref: string;
      readonly store: string;
      readonly bytes: number;
      readonly durationMs: number;
    })
  | (LifecycleEventBase<'claim.deleted'> & {
      readonly ref: string;
      readonly store: string;
      readonly reason: string;
    });

/** Resequencer: gaps in a key's sequence numbers. */
export type ResequencerLifecycleEvent =
  | (LifecycleEventBase<'gap.opened'> & {
      readonly key: string;
      /** The sequence number the key waits for. */
      readonly expected: number;
      /** Events held behind the gap. */
      readonly held: number;
    })
  | (LifecycleEventBase<'gap.closed'> & {
      readonly key: string;
      readonly expected: number;
      readonly waitedMs: number;
    })
  | (LifecycleEventBase<'gap.skipped'> & {
      readonly key: string;
      readonly from: number;
      readonly to: number;
      readonly waitedMs: number;
      readonly reason: string;
    })
  | (LifecycleEventBase<'gap.dead-lettered'> & {
      readonly key: string;
      readonly expected: number;
      readonly waitedMs: number;
      readonly reason: string;
    });

/** Outbox and inbox rows. */
export type BoxLifecycleEvent =
  | (LifecycleEventBase<'outbox.published'> & {
      readonly id: string;
      readonly attempts: number;
      /** From the commit to the broker's confirm. */
      readonly lagMs: number;
    })
  | (LifecycleEventBase<'outbox.retried'> & {
      readonly id: string;
      readonly attempts: number;
      readonly reason: string;
      readonly nextAttemptAt: number;
    })
  | (LifecycleEventBase<'outbox.failed'> & {
      readonly id: string;
      readonly attempts: number;
      readonly reason: string;
    })
  | (LifecycleEventBase<'inbox.handled'> & {
      readonly id: string;
      readonly attempts: number;
      readonly durationMs: number;
    })
  | (LifecycleEventBase<'inbox.duplicate'> & { readonly id: string });

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
 * `events$` (or `of(type)`). Emitting is synchronous, on the path that did the work, and costs
 * one property read when nobody listens: the event object is only built for a listener.
 *
 * A listener that throws is logged and detached from nothing else: the message it concerned goes
 * on as if nobody listened.
 */
@Injectable()
export class SequenceEvents {
  private readonly logger = new Logger('SequenceEvents');
  private readonly listeners = new Set<Listener>();

  /** Every event, as it happens. */
  readonly events$: Observable<LifecycleEvent> = new Observable((subscriber) => {
    const listener: Listener = (event) => subscriber.next(event);
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  });

  /** The events of one or more types, typed by them. */
  of<T extends LifecycleEventType>(
    ...types: T[]
  ): Observable<Extract<LifecycleEvent, { type: T }>> {
    const wanted = new Set<string>(types);
    return new Observable((subscriber) => {
      const listener: Listener = (event) => {
        if (wanted.has(event.type)) subscriber.next(event as Extract<LifecycleEvent, { type: T }>);
      };
      this.listeners.add(listener);
      return () => this.listeners.delete(listener);
    });
  }

  /** True while anything listens: callers skip measuring what only an event would carry. */
  get listening(): boolean {
    return this.listeners.size > 0;
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
}
