import { sep } from 'node:path';

/** A stack frame in the library's own source (not a test) is the library at work. */
const LIBRARY_SOURCE = `${sep}libs${sep}sequence${sep}src${sep}`;

/** The stack frame that called `callee`. */
function callerOf(callee: (...args: never[]) => unknown): string {
  const holder: { stack?: string } = {};
  Error.captureStackTrace(holder, callee);
  return holder.stack?.split('\n')[1]?.trim() ?? 'an unknown caller';
}

function isLibrary(frame: string): boolean {
  return frame.includes(LIBRARY_SOURCE) && !frame.includes('.spec.ts');
}

/**
 * Records what the library's own code does to objects of other packages: reads and writes of
 * their fields, calls of their methods. Only accesses whose direct caller is a file of
 * `libs/sequence/src` count; the owning package's own accesses (ioredis reading its `stream`,
 * amqplib calling its socket's `write`) pass unrecorded. `restore()` undoes every watch.
 */
export class LibraryAccesses {
  /** One line per access, e.g. `read Connection.muxer at multiplexerOf (…amqp-frame-writes.ts:28:…)`. */
  readonly log: string[] = [];
  private readonly undo: Array<() => void> = [];

  /** Watches `target[key]`, a data property (or none yet): reads and assignments. */
  property(target: object, key: string, label: string): this {
    const record = target as Record<string, unknown>;
    const own = Object.getOwnPropertyDescriptor(target, key);
    if (own && !('value' in own)) throw new Error(`${label} is an accessor already`);
    let value = own?.value as unknown;
    const log = this.log;
    Object.defineProperty(target, key, {
      configurable: true,
      enumerable: own?.enumerable ?? true,
      get: function get() {
        const frame = callerOf(get);
        if (isLibrary(frame)) log.push(`read ${label} at ${frame}`);
        return value;
      },
      set: function set(next: unknown) {
        const frame = callerOf(set);
        if (isLibrary(frame)) log.push(`wrote ${label} at ${frame}`);
        value = next;
      },
    });
    this.undo.push(() => {
      Reflect.deleteProperty(record, key);
      if (own || value !== undefined) {
        Object.defineProperty(target, key, {
          value,
          writable: true,
          configurable: true,
          enumerable: own?.enumerable ?? true,
        });
      }
    });
    return this;
  }

  /** Watches calls of `methods` on every object that inherits them from `prototype`. */
  methods(prototype: object, methods: readonly string[], label: string): this {
    const record = prototype as Record<string, unknown>;
    for (const method of methods) {
      const own = Object.getOwnPropertyDescriptor(prototype, method);
      const original = record[method] as (...args: unknown[]) => unknown;
      if (typeof original !== 'function') throw new Error(`${label}.${method} is not a method`);
      const log = this.log;
      const watched = function (this: unknown, ...args: unknown[]) {
        const frame = callerOf(watched);
        if (isLibrary(frame)) {
          const first = typeof args[0] === 'string' ? `'${args[0]}'` : '…';
          log.push(`called ${label}.${method}(${args.length > 0 ? first : ''}) at ${frame}`);
        }
        return original.apply(this, args);
      };
      record[method] = watched;
      this.undo.push(() => {
        if (own) Object.defineProperty(prototype, method, own);
        else Reflect.deleteProperty(record, method);
      });
    }
    return this;
  }

  restore(): void {
    for (let step = this.undo.pop(); step; step = this.undo.pop()) step();
  }
}
