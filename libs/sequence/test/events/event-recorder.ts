import type { INestApplicationContext } from '@nestjs/common';
import { SequenceEvents, type LifecycleEvent } from 'nest-sequence';

/** Every lifecycle event an application emits from now on, in order. */
export interface EventRecorder {
  readonly events: LifecycleEvent[];
  /** The events of these types, in order. */
  only(...types: LifecycleEvent['type'][]): LifecycleEvent[];
  stop(): void;
}

export function recordEvents(app: INestApplicationContext): EventRecorder {
  const events: LifecycleEvent[] = [];
  const subscription = app.get(SequenceEvents).events$.subscribe((event) => events.push(event));
  return {
    events,
    only: (...types) => events.filter((event) => types.includes(event.type)),
    stop: () => subscription.unsubscribe(),
  };
}
