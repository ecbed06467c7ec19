import {
  Observable,
  Subscriber,
  type Observer,
  type Operator,
  type Subscription,
  type TeardownLogic,
} from 'rxjs';

/**
 * An Observable whose subscribers' errors are reported to `report` instead of reaching rxjs, which
 * rethrows an error from a `next` callback (or one that nobody handles) on a timer, where it
 * crashes the process (rxjs 7, unless `config.onUnhandledError` is set). Operators piped from it
 * build more of it (`lift`), so `events$.pipe(filter(...)).subscribe(fn)` is guarded too.
 * What leaves the chain (a Subject subscribed to it, an outer `switchMap`) has rxjs's handling.
 */
export class GuardedObservable<T> extends Observable<T> {
  constructor(
    private readonly report: (error: unknown) => void,
    subscribe?: (subscriber: Subscriber<T>) => TeardownLogic,
  ) {
    super(subscribe);
  }

  override lift<R>(operator?: Operator<T, R>): Observable<R> {
    const lifted = new GuardedObservable<R>(this.report);
    lifted.source = this;
    lifted.operator = operator;
    return lifted;
  }

  override subscribe(
    observerOrNext?: Partial<Observer<T>> | ((value: T) => void) | null,
    ...rest: Array<((error: unknown) => void) | (() => void) | null | undefined>
  ): Subscription {
    // An rxjs Subscriber is an operator's (or firstValueFrom's) plumbing: its errors travel down
    // the chain to a subscriber that is guarded here.
    if (observerOrNext instanceof Subscriber) return super.subscribe(observerOrNext);
    const observer: Partial<Observer<T>> =
      typeof observerOrNext === 'function' || observerOrNext == null
        ? {
            next: observerOrNext ?? undefined,
            error: rest[0] ?? undefined,
            complete: (rest[1] ?? undefined) as (() => void) | undefined,
          }
        : observerOrNext;
    const guarded: Partial<Observer<T>> = {
      next: (value) => this.guarded(() => observer.next?.(value)),
      error: (error: unknown) =>
        observer.error ? this.guarded(() => observer.error?.(error)) : this.report(error),
      complete: () => this.guarded(() => observer.complete?.()),
    };
    return super.subscribe(guarded);
  }

  private guarded(call: () => void): void {
    try {
      call();
    } catch (error) {
      this.report(error);
    }
  }
}
