import { connect as connectAmqp } from 'amqplib';
import * as natsClient from '@nats-io/transport-node';
import { Redis } from 'ioredis';
import { Client as PgClient } from 'pg';

/**
 * `@nats-io/transport-node`'s `connect`, as far as the probe uses it: the client declares its
 * types in a package subpath that the demo's `moduleResolution: node` does not follow.
 */
const connectNats = natsClient.connect as unknown as (options: {
  servers: string[];
  timeout: number;
  reconnect: boolean;
}) => Promise<{ close(): Promise<void> }>;

/** How long a server may take to answer before the demo says it cannot reach it. */
const REACH_TIMEOUT_MS = 5_000;

/**
 * A server the environment names did not answer. Commands catch it and exit 1 with its lines,
 * one per server, instead of a stack trace from inside Nest's bootstrap (or, for Redis, whose
 * client reconnects forever, instead of hanging).
 */
export class DemoServerError extends Error {
  override readonly name = 'DemoServerError';

  constructor(readonly problems: readonly string[]) {
    super(problems.join('\n'));
  }
}

interface Probe {
  readonly variable: string;
  readonly server: string;
  /** Connects, and closes what it opened, whether it answered or not. */
  readonly reach: (url: string, timeoutMs: number) => Promise<void>;
}

const PROBES: readonly Probe[] = [
  {
    variable: 'AMQP_URL',
    server: 'RabbitMQ',
    reach: async (url, timeoutMs) => {
      const connection = await connectAmqp(url, { timeout: timeoutMs });
      await connection.close();
    },
  },
  {
    variable: 'NATS_URL',
    server: 'NATS',
    reach: async (url, timeoutMs) => {
      const servers = url.split(',').map((server) => server.trim());
      const connection = await connectNats({ servers, timeout: timeoutMs, reconnect: false });
      await connection.close();
    },
  },
  {
    variable: 'REDIS_URL',
    server: 'Redis',
    reach: async (url, timeoutMs) => {
      const client = new Redis(url, {
        lazyConnect: true,
        connectTimeout: timeoutMs,
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
      });
      // The client's `error` event says why (ECONNREFUSED); its rejection, only that it closed.
      let cause: unknown;
      client.on('error', (error) => (cause = error));
      try {
        await client.connect();
        await client.ping();
      } catch (error) {
        throw cause ?? error;
      } finally {
        client.disconnect();
      }
    },
  },
  {
    variable: 'DATABASE_URL',
    server: 'PostgreSQL',
    reach: async (url, timeoutMs) => {
      const client = new PgClient({ connectionString: url, connectionTimeoutMillis: timeoutMs });
      client.on('error', () => undefined);
      try {
        await client.connect();
      } finally {
        await client.end().catch(() => undefined);
      }
    },
  },
];

/**
 * Connects once to every server the environment names (their URLs already checked by
 * `readDemoEnvironment`), all at once, and closes again.
 * @throws DemoServerError naming each variable whose server did not answer, and why
 */
export async function checkDemoServers(
  env: NodeJS.ProcessEnv = process.env,
  timeoutMs = REACH_TIMEOUT_MS,
): Promise<void> {
  const named = PROBES.filter((probe) => env[probe.variable]);
  const failures = await Promise.all(
    named.map(async ({ variable, server, reach }) => {
      const url = env[variable]!;
      try {
        await withDeadline(reach(url, timeoutMs), timeoutMs + 1_000);
        return undefined;
      } catch (error) {
        return `cannot reach ${server} at ${withoutPassword(url)} (${variable}): ${reasonOf(error)}`;
      }
    }),
  );
  const problems = failures.filter((failure): failure is string => failure !== undefined);
  if (problems.length > 0) throw new DemoServerError(problems);
}

function withDeadline(reached: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([reached, late]).finally(() => clearTimeout(timer));
}

/** The URL to print: its password replaced, for a line that ends up in logs. */
function withoutPassword(url: string): string {
  return url
    .split(',')
    .map((each) => {
      try {
        const parsed = new URL(each.trim());
        if (parsed.password) parsed.password = '***';
        return parsed.toString();
      } catch {
        return each.trim();
      }
    })
    .join(',');
}

function reasonOf(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) return reasonOf(error.errors[0]);
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    const message = error.message || error.name;
    return typeof code === 'string' && !message.includes(code) ? `${code}: ${message}` : message;
  }
  return String(error);
}
