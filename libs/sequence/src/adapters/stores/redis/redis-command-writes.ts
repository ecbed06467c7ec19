import type { Socket } from 'node:net';
import type { RedisClient, Script, ScriptName, Scripts } from './redis-scripts';

/**
 * ioredis writes every command to its socket at once: one `socket.write` (one system call, one
 * TCP segment, one wake-up of the server) per command. A consumer that handles a batch of
 * deliveries in one turn of the event loop sends a script call for each; corking the socket
 * until the end of that turn (`process.nextTick`, after the turn's promise reactions) sends them
 * in one `writev` instead. The commands, their order and their replies are unchanged; they leave
 * at most one turn of the event loop's microtasks later.
 *
 * Only a standalone client is corked. A Cluster client routes each command to the connection of
 * a node; those are left alone.
 *
 * `client.stream` is not part of ioredis's public API (its declaration is marked `@ignore`): the
 * stores cork it only with `unsafeSocketTricks`, on ioredis 5 ({@link withCoalescedWrites}).
 */
const corked = new WeakSet<Socket>();

export function coalesceCommandWrites(client: RedisClient): void {
  const stream = (client as { stream?: Partial<Socket> }).stream as Socket | undefined;
  if (!stream || corked.has(stream) || typeof stream.cork !== 'function') return;
  corked.add(stream);
  stream.cork();
  process.nextTick(() => {
    corked.delete(stream);
    stream.uncork();
  });
}

/** `scripts`, each call corking `client`'s socket for the rest of the turn first. */
export function withCoalescedWrites(client: RedisClient, scripts: Scripts): Scripts {
  const corking = {} as Record<ScriptName, Script>;
  for (const [name, script] of Object.entries(scripts) as Array<[ScriptName, Script]>) {
    corking[name] = (keys, args) => {
      coalesceCommandWrites(client);
      return script(keys, args);
    };
  }
  return corking;
}
