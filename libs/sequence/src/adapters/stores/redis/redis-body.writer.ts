import type { Command } from 'ioredis';
import type { RedisClient } from './redis-scripts';

/** The part of a socket the writer needs. */
interface SocketLike {
  write(chunk: string | Buffer): boolean;
}

type UncopiedSetClass = new (
  key: string,
  body: Buffer,
  ttlMs: number,
  keyPrefix?: string,
) => Command;

let uncopiedSet: UncopiedSetClass | undefined;

/**
 * `SET <key> <body> PX <ttlMs>` without copying the body; resolves to the reply, `OK`.
 *
 * ioredis encodes a command with a Buffer argument by concatenating every part into one new
 * Buffer, so an 8 MiB body costs an 8 MiB allocation and copy before it reaches the socket (and,
 * at hundreds of MiB per second, most of the garbage the collector then has to chase). This
 * command writes the RESP header, then the body itself, straight to the connection's socket, and
 * hands ioredis only the tail to write: the bytes on the wire are exactly those of the plain
 * command, in the same place in the connection's command stream, and the reply is matched to it
 * by ioredis as usual (retries, offline queue, timeouts and Cluster redirections included: each
 * (re)send writes the whole command again).
 *
 * Meant for a command sent on its own with `sendCommand`. In a pipeline or MULTI, which collect
 * what `toWritable` returns and write it later, it falls back to ioredis's own encoding. It
 * relies on how ioredis 5 sends a command (`toWritable(socket)`, its result written to that
 * socket at once); the tests pin that down.
 */
export function setBodyUncopied(
  redis: RedisClient,
  key: string,
  body: Buffer,
  ttlMs: number,
): Promise<string> {
  const Set = (uncopiedSet ??= defineUncopiedSet());
  const command = new Set(key, body, ttlMs, redis.options.keyPrefix);
  return redis.sendCommand(command) as Promise<string>;
}

function defineUncopiedSet(): UncopiedSetClass {
  // ioredis is an optional peer of the library: loaded with the first Redis store, not before.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { Command: IoredisCommand } = require('ioredis') as typeof import('ioredis');

  return class UncopiedSet extends IoredisCommand {
    constructor(key: string, body: Buffer, ttlMs: number, keyPrefix?: string) {
      super('set', [key, body, 'PX', String(ttlMs)], { keyPrefix, replyEncoding: 'utf8' });
    }

    override toWritable(socket: object): string | Buffer {
      const target = socket as Partial<SocketLike>;
      // In a pipeline or MULTI, what this returns is collected and written later with the rest:
      // the plain (copying) encoding is the only correct one there.
      const queued = this.inTransaction || this.pipelineIndex !== undefined;
      if (queued || typeof target.write !== 'function') return super.toWritable(socket);
      // After the constructor, args hold the key with the client's keyPrefix applied.
      const [key, body, px, ttl] = this.args as [string | Buffer, Buffer, string, string];
      const keyBytes = typeof key === 'string' ? Buffer.from(key) : key;
      target.write(
        Buffer.concat([
          Buffer.from(`*5\r\n$3\r\nset\r\n$${keyBytes.length}\r\n`),
          keyBytes,
          Buffer.from(`\r\n$${body.length}\r\n`),
        ]),
      );
      target.write(body);
      return `\r\n$${px.length}\r\n${px}\r\n$${ttl.length}\r\n${ttl}\r\n`;
    }
  };
}
