import { DemoEnvironmentError } from '../demo-environment.error';
import { outboxTablePrefix } from '../infrastructure';

/** What the orders module needs: where its event travels, and what its tables are called. */
export interface OrdersSettings {
  /** Put before every channel name (`<prefix>events.OrderPlaced`). */
  readonly channelPrefix: string;
  /**
   * Put before every table name: the business tables (`<prefix>orders`, `<prefix>stock`, ...),
   * and on PostgreSQL the outbox store's too (infrastructure.ts gives it the same one).
   */
  readonly tablePrefix: string;
}

/** What `npm run demo:orders` reads from the environment (besides the adapters). */
export interface OrdersEnvironment extends OrdersSettings {
  /** `ORDERS`: how many orders the run places over HTTP. @default 20 */
  readonly orders: number;
  /** `PORT`: the HTTP port; 0 picks a free one. @default 3000 */
  readonly port: number;
  /** `SERVE=1`: keep serving the HTTP API after the summary, until SIGTERM or Ctrl-C. */
  readonly serve: boolean;
}

export const ORDERS_DEFAULTS = { orders: 20, port: 3_000 } as const;

/** Each order is an HTTP request and a reservation: enough to show the pattern, quick to run. */
const MAX_ORDERS = 1_000;
const MAX_PORT = 65_535;
/** Channel (queue) names keep to what every broker accepts. */
const CHANNEL_PREFIX = /^[A-Za-z0-9._:-]{0,64}$/;
/** What PostgresOutboxStore accepts, so that the business tables' names are as safe. */
const TABLE_PREFIX = /^[A-Za-z_][A-Za-z0-9_]{0,40}$/;

/**
 * Reads and checks the orders demo's settings; every problem is reported at once.
 * @throws DemoEnvironmentError naming each variable that is wrong and how to fix it
 */
export function readOrdersEnvironment(env: NodeJS.ProcessEnv = process.env): OrdersEnvironment {
  const variables: string[] = [];
  const problems: string[] = [];
  const problem = (variable: string, text: string) => {
    variables.push(variable);
    problems.push(`${variable} ${text}`);
  };
  const wholeNumber = (variable: string, fallback: number, min: number, max: number): number => {
    const text = env[variable];
    if (text === undefined || text === '') return fallback;
    const value = Number(text);
    if (/^\d+$/.test(text) && value >= min && value <= max) return value;
    problem(variable, `must be a whole number from ${min} to ${max}, got ${JSON.stringify(text)}`);
    return fallback;
  };

  const orders = wholeNumber('ORDERS', ORDERS_DEFAULTS.orders, 1, MAX_ORDERS);
  const port = wholeNumber('PORT', ORDERS_DEFAULTS.port, 0, MAX_PORT);
  const channelPrefix = env.ORDERS_CHANNEL_PREFIX ?? '';
  if (!CHANNEL_PREFIX.test(channelPrefix)) {
    problem(
      'ORDERS_CHANNEL_PREFIX',
      `may hold up to 64 of A-Z a-z 0-9 . _ : -, got ${JSON.stringify(channelPrefix)}`,
    );
  }
  const tablePrefix = outboxTablePrefix(env);
  if (!TABLE_PREFIX.test(tablePrefix)) {
    problem(
      'OUTBOX_TABLE_PREFIX',
      'must be a letter or underscore, then up to 40 letters, digits or underscores, got ' +
        JSON.stringify(tablePrefix),
    );
  }
  const serve = env.SERVE ?? '';
  if (!['', '0', '1'].includes(serve)) {
    problem('SERVE', `must be 1 (keep serving) or 0, got ${JSON.stringify(serve)}`);
  }

  if (problems.length > 0) throw new DemoEnvironmentError(variables, problems);
  return { orders, port, serve: serve === '1', channelPrefix, tablePrefix };
}
