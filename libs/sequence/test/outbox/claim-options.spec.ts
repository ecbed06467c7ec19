import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { type BoxName, type ClaimOptions } from 'nest-sequence/ports';
import { type OutboxStore } from 'nest-sequence';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

/** A store that records the options of every claim, by box, and forwards everything. */
function recordingClaims(store: OutboxStore): {
  store: OutboxStore;
  claims: Map<BoxName, ClaimOptions[]>;
} {
  const claims = new Map<BoxName, ClaimOptions[]>();
  const recording = new Proxy(store, {
    get(target, property, receiver) {
      if (property === 'claim') {
        const claim: OutboxStore['claim'] = (box, options, handle) => {
          claims.set(box, [...(claims.get(box) ?? []), options]);
          return target.claim(box, options, handle);
        };
        return claim;
      }
      const value: unknown = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
    },
  });
  return { store: recording, claims };
}

/**
 * Which claims may a transaction() of their handler join: an inbox processor's (its handlers'
 * writes, processInTransaction, commit with the inbox mark), not a relay's, whose handling only
 * publishes and would otherwise keep Node tracking the async context of every promise.
 */
describe('the claims of relays and inbox processors', () => {
  let t: OutboxTestApp | undefined;

  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('relays claim with joinable: false; inbox processors leave it to the store (joining)', async () => {
    const { store, claims } = recordingClaims(
      await SqliteOutboxStore.open({ filename: ':memory:' }),
    );
    t = await createOutboxTestApp({
      store,
      outboxEvents: FAST_BOX,
      outboxCommands: FAST_BOX,
      // Enabled without handlers: their processors claim (and find nothing) all the same.
      inboxEvents: { ...FAST_BOX, enabled: true },
      inboxCommands: { ...FAST_BOX, enabled: true },
    });
    const boxes: BoxName[] = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];
    await eventually(
      () => boxes.every((box) => (claims.get(box)?.length ?? 0) > 0),
      'a claim of every box',
    );
    for (const box of ['outbox_events', 'outbox_commands'] as const) {
      expect(claims.get(box)!.every((options) => options.joinable === false)).toBe(true);
    }
    for (const box of ['inbox_events', 'inbox_commands'] as const) {
      expect(claims.get(box)!.every((options) => options.joinable !== false)).toBe(true);
    }
  });

  it('the relay of a box with retentionMs 0 claims with deleteCompleted; the others do not', async () => {
    const { store, claims } = recordingClaims(
      await SqliteOutboxStore.open({ filename: ':memory:' }),
    );
    t = await createOutboxTestApp({
      store,
      outboxEvents: { ...FAST_BOX, retentionMs: 0 },
      outboxCommands: FAST_BOX,
      inboxEvents: { ...FAST_BOX, enabled: true },
    });
    const boxes: BoxName[] = ['outbox_events', 'outbox_commands', 'inbox_events'];
    await eventually(
      () => boxes.every((box) => (claims.get(box)?.length ?? 0) > 0),
      'a claim of every box',
    );
    expect(claims.get('outbox_events')!.every((options) => options.deleteCompleted)).toBe(true);
    for (const box of ['outbox_commands', 'inbox_events'] as const) {
      expect(claims.get(box)!.every((options) => !options.deleteCompleted)).toBe(true);
    }
  });
});
