import type { LifecycleEvent } from 'nest-sequence';
import { bytes, eventually } from '../support/sequence-test-app';
import { createRealServersApp, type RealServersApp } from '../faults/support/real-servers.app';
import { useFaultServersOn } from '../faults/support/fault-servers';
import { describeOnTransports } from '../support/transports.fixture';
import { recordEvents, type EventRecorder } from './event-recorder';

jest.setTimeout(30_000);

/**
 * Two instances consuming one channel over a real broker and one Redis: each sequence's
 * `sequence.started` and `sequence.completed`, and each fragment's `fragment.accepted`, are
 * emitted once across the cluster, by whichever instance made the store step that decided it.
 */
describeOnTransports(
  'lifecycle events: two instances on one channel and one Redis',
  ['redis'],
  (on) => {
    const apps: RealServersApp[] = [];
    const servers = useFaultServersOn(on, {
      beforeCleanup: async () => {
        for (const app of apps.splice(0)) await app.close();
      },
    });

    it('emits sequence.started, fragment.accepted and sequence.completed once per cluster', async () => {
      const channel = servers.admin.newChannel();
      for (let i = 0; i < 2; i++) {
        apps.push(
          await createRealServersApp(channel, {
            on,
            prefix: servers.prefix,
            handler: { maxFragmentBytes: 64 * 1024 },
          }),
        );
      }
      const recorders: EventRecorder[] = apps.map((app) => recordEvents(app.app));
      await eventually(
        async () => (await servers.admin.consumerCount(channel)) >= 2,
        'both instances consuming',
      );
      const ids = Array.from({ length: 6 }, (_, i) => `events-cluster-${i}`);

      await Promise.all(
        ids.map((id, i) =>
          apps[0].splitter.send(channel, bytes(80_000, 30 + i), {
            sequenceId: id,
            fragmentBytes: 8_000,
          }),
        ),
      );
      const all = () => recorders.flatMap((recorder) => recorder.events);
      const ofType = <T extends LifecycleEvent['type']>(type: T) =>
        all().filter((event): event is Extract<LifecycleEvent, { type: T }> => event.type === type);
      await eventually(
        () => ofType('sequence.completed').length >= ids.length,
        'all completed',
        20_000,
      );
      await eventually(
        async () => (await servers.admin.readyCount(channel)) === 0,
        'the channel drained',
      );

      const sortedIds = (events: Array<{ sequenceId: string }>) =>
        events.map((event) => event.sequenceId).sort();
      expect(sortedIds(ofType('sequence.completed'))).toEqual([...ids].sort());
      expect(sortedIds(ofType('sequence.started'))).toEqual([...ids].sort());
      for (const id of ids) {
        const positions = ofType('fragment.accepted')
          .filter((event) => event.sequenceId === id)
          .map((event) => event.position)
          .sort((a, b) => a - b);
        expect(positions).toEqual(Array.from({ length: 10 }, (_, i) => i + 1));
      }
      // Both instances took part: the events are emitted where the work was done.
      for (const recorder of recorders)
        expect(recorder.only('fragment.accepted').length).toBeGreaterThan(0);
      expect(ofType('fragment.rejected')).toEqual([]);
    });
  },
);
