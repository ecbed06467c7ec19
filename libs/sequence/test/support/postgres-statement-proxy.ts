import { createServer, connect, type Server, type Socket } from 'node:net';

/**
 * What the proxy does with a statement a client sends (its SQL text, from a simple `Query` or an
 * extended-protocol `Parse` message):
 * - `pass`: forwards it;
 * - `drop-before`: closes both connections instead of forwarding it (the server never runs it);
 * - `drop-after`: forwards it, lets the server run it, and closes both connections when the
 *   server's answer comes, before any of it reaches the client (a COMMIT that committed, whose
 *   answer was lost).
 */
export type StatementFate = 'pass' | 'drop-before' | 'drop-after';

export interface PostgresStatementProxy {
  /** `target` with the proxy's host and port in place of the server's. */
  readonly url: string;
  /** The statements dropped so far (their SQL text), in order. */
  readonly dropped: readonly string[];
  close(): Promise<void>;
}

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;

/**
 * A TCP proxy in front of the PostgreSQL at `target` (a `postgres://` URL) that reads the
 * frontend protocol of each connection and asks `fate` about every statement: a connection that
 * fails at one exact statement, deterministically (a real server, a real driver, a real socket
 * close).
 */
export async function postgresStatementProxy(
  target: string,
  fate: (sql: string) => StatementFate,
): Promise<PostgresStatementProxy> {
  const upstream = new URL(target);
  const sockets = new Set<Socket>();
  const dropped: string[] = [];

  const server: Server = createServer((client) => {
    const backend = connect(Number(upstream.port || 5432), upstream.hostname);
    sockets.add(client).add(backend);
    let ended = false;
    let dropOnAnswer = false;
    let startup = true;
    let pending = Buffer.alloc(0);

    const drop = (sql: string): void => {
      dropped.push(sql);
      ended = true;
      client.destroy();
      backend.destroy();
    };

    backend.on('data', (chunk: Buffer) => {
      if (ended) return;
      if (dropOnAnswer) drop('(its answer)');
      else client.write(chunk);
    });
    client.on('data', (chunk: Buffer) => {
      if (ended) return;
      pending = Buffer.concat([pending, chunk]);
      // Whole messages only: forwarded one by one, each after its fate was asked.
      for (;;) {
        const headerLength = startup ? 0 : 1;
        if (pending.length < headerLength + 4) return;
        const length = pending.readInt32BE(headerLength);
        const size = headerLength + length;
        if (pending.length < size) return;
        const message = pending.subarray(0, size);
        pending = pending.subarray(size);
        if (startup) {
          const code = message.readInt32BE(4);
          // An SSL or GSS encryption request is followed by the real startup message.
          startup = code === SSL_REQUEST || code === GSSENC_REQUEST;
          backend.write(message);
          continue;
        }
        const sql = statementOf(message);
        const decision = sql === undefined ? 'pass' : fate(sql);
        if (decision === 'drop-before') {
          drop(sql!);
          return;
        }
        backend.write(message);
        if (decision === 'drop-after') {
          dropped.push(sql!);
          dropOnAnswer = true;
        }
      }
    });
    for (const socket of [client, backend]) {
      socket.on('error', () => undefined);
      socket.on('close', () => {
        sockets.delete(socket);
        client.destroy();
        backend.destroy();
      });
    }
  });

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  const url = new URL(target);
  url.hostname = '127.0.0.1';
  url.port = String(port);

  return {
    url: url.toString(),
    dropped,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** The SQL text of a `Query` ('Q') or `Parse` ('P') message; undefined for any other message. */
function statementOf(message: Buffer): string | undefined {
  const type = String.fromCharCode(message[0]);
  const body = message.subarray(5);
  if (type === 'Q') return body.subarray(0, body.indexOf(0)).toString('utf8');
  if (type === 'P') {
    const nameEnd = body.indexOf(0);
    const textStart = nameEnd + 1;
    return body.subarray(textStart, body.indexOf(0, textStart)).toString('utf8');
  }
  return undefined;
}
