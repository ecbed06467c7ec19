import { SequenceEvents } from 'nest-sequence';
import { ClaimCheckLifecycle } from '../../src/claim-check/claim-check.events';
import { SequenceLifecycle } from '../../src/sequence/sequence.events';

/** An `of(type)` subscription turns on its types only: other emission points build nothing. */
describe('lifecycle events: listening by type', () => {
  it('counts of() subscriptions per type, and events$ for every type, until they end', () => {
    const events = new SequenceEvents();
    expect(events.listeningTo('claim.deleted')).toBe(false);

    const deleted = events.of('claim.deleted', 'sequence.failed').subscribe();
    const failed = events.of('sequence.failed').subscribe();
    expect(events.listeningTo('claim.deleted')).toBe(true);
    expect(events.listeningTo('sequence.failed')).toBe(true);
    expect(events.listeningTo('sequence.started')).toBe(false);

    const all = events.events$.subscribe();
    expect(events.listeningTo('sequence.started')).toBe(true);
    all.unsubscribe();
    all.unsubscribe();
    expect(events.listeningTo('sequence.started')).toBe(false);

    deleted.unsubscribe();
    expect(events.listeningTo('claim.deleted')).toBe(false);
    expect(events.listeningTo('sequence.failed')).toBe(true);
    failed.unsubscribe();
    expect(events.listeningTo('sequence.failed')).toBe(false);
  });

  it('an emission point of another type builds no event; one of the type does', () => {
    const events = new SequenceEvents();
    const received: string[] = [];
    const subscription = events.of('claim.deleted').subscribe((event) => received.push(event.type));
    const emit = jest.spyOn(events, 'emit');

    new SequenceLifecycle(events).rejected('events.by-type', 'seq-1', 'sequence-too-large', 'x');
    expect(emit).not.toHaveBeenCalled();

    new ClaimCheckLifecycle(events).deleted('events.by-type', 'filesystem', 'ref-1', 'released');
    expect(emit).toHaveBeenCalledTimes(1);
    expect(received).toEqual(['claim.deleted']);
    subscription.unsubscribe();
  });
});
