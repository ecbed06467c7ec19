import { resolve } from 'node:path';
import type { Database } from 'better-sqlite3';
import type { BoxName } from '../../../ports/outbox-store.port';

type Listener = (box: BoxName) => void;

/** Listeners of every store in this process, by database file and table prefix. */
const channels = new Map<string, Set<Listener>>();
const unnamed = new WeakMap<Database, string>();
let unnamedCount = 0;

/**
 * The channel of the boxes of `tablePrefix` in `database`: its resolved file name (so that
 * stores opened on the same file in this process wake each other), or, for an in-memory
 * database, one of that `Database` object's own.
 */
export function wakeupChannel(database: Database, tablePrefix: string): string {
  let place: string;
  if (database.memory) {
    place = unnamed.get(database) ?? `memory:${++unnamedCount}`;
    unnamed.set(database, place);
  } else {
    place = `file:${resolve(database.name)}`;
  }
  // SQLite matches table names without regard to ASCII case (the only letters a prefix may
  // hold): 'App_' and 'app_' name the same tables, so they share a channel.
  return `${place}\u0000${tablePrefix.toLowerCase()}`;
}

/**
 * In-process wake-ups of one store: after a commit that appended to a box, every listener of
 * the channel is called with the box as soon as the committing call has returned (a microtask:
 * never inside it, and before anything that awaits it goes on, so that a relay is woken before a
 * shutdown that follows the commit stops it). Other processes are not told: their relays poll.
 */
export class SqliteOutboxWakeups {
  private readonly own = new Set<Listener>();

  constructor(private readonly channel: string) {}

  add(listener: Listener): () => void {
    // One entry per subscription, so that a listener subscribed twice is removed once per call.
    const subscription: Listener = (box) => listener(box);
    this.own.add(subscription);
    let listeners = channels.get(this.channel);
    if (!listeners) {
      listeners = new Set();
      channels.set(this.channel, listeners);
    }
    listeners.add(subscription);
    return () => this.remove(subscription);
  }

  notify(box: BoxName): void {
    queueMicrotask(() => {
      for (const listener of channels.get(this.channel) ?? []) call(listener, box);
    });
  }

  removeAll(): void {
    for (const listener of [...this.own]) this.remove(listener);
  }

  private remove(listener: Listener): void {
    this.own.delete(listener);
    const listeners = channels.get(this.channel);
    if (!listeners) return;
    listeners.delete(listener);
    if (listeners.size === 0) channels.delete(this.channel);
  }
}

/** A listener that throws (or rejects) must not stop the others, nor crash the process. */
function call(listener: Listener, box: BoxName): void {
  try {
    const result = listener(box) as unknown;
    if (result instanceof Promise) result.catch(() => undefined);
  } catch {
    // A wake-up is a hint; the listener's own polling covers what it missed.
  }
}
