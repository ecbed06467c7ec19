import type { PoolClient, QueryResult } from 'pg';
import { loadPg } from './postgres-client';

/** One statement of a pipeline: `name` for a statement already prepared on the connection. */
export interface PipelineStep {
  readonly text: string;
  readonly values?: readonly unknown[];
  /** The name of a prepared statement; used only if the connection has parsed it already. */
  readonly name?: string;
}

/** What `pg` gives a query class: the parts of its connection a pipeline writes to. */
interface PgConnection {
  readonly parsedStatements: Record<string, string | undefined>;
  parse(message: { text: string; name: string; types: unknown[] }): void;
  bind(message: { portal: string; statement: string; values: unknown[] }): void;
  describe(message: { type: 'P'; name: string }): void;
  execute(message: { portal: string; rows: number }): void;
  sync(): void;
}

const FAILED_STEP = Symbol('nest-sequence pipeline step');

/** The index of the step of a pipeline that failed with `error`, when it came from one. */
export function failedStepOf(error: unknown): number | undefined {
  return error !== null && typeof error === 'object'
    ? ((error as Record<symbol, number | undefined>)[FAILED_STEP] ?? undefined)
    : undefined;
}

type Callback = (error: Error | null, results?: QueryResult | QueryResult[]) => void;

interface PgQuery {
  handleError(error: unknown, connection: PgConnection): void;
}
type PgQueryClass = new (config: { text: string; callback: Callback }) => PgQuery;

let pipelinedQueryClass:
  (new (steps: readonly PipelineStep[], callback: Callback) => object) | undefined;

/**
 * A `pg` query (its own `Query`, whose results handling already collects one result per
 * statement) that writes several statements with the extended protocol and a single Sync: one
 * round trip. PostgreSQL runs them in order and, when one fails, skips the rest up to the Sync,
 * as a multi-statement query would; the statements inside an open transaction stay in it.
 */
function pipelinedQuery(): new (steps: readonly PipelineStep[], callback: Callback) => object {
  if (pipelinedQueryClass) return pipelinedQueryClass;
  loadPg();
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- pg's own Query, see above
  const Query = require('pg/lib/query') as PgQueryClass;
  // eslint-disable-next-line @typescript-eslint/no-require-imports -- how pg maps parameters
  const { prepareValue } = require('pg/lib/utils') as { prepareValue(value: unknown): unknown };
  class PipelinedQuery extends Query {
    constructor(
      private readonly steps: readonly PipelineStep[],
      callback: Callback,
    ) {
      super({ text: steps.map((step) => step.text).join(';\n'), callback });
    }

    requiresPreparation(): boolean {
      return true;
    }

    /** Notes which step failed (the results before it are complete) on the error. */
    override handleError(error: unknown, connection: PgConnection): void {
      if (error !== null && typeof error === 'object' && !(FAILED_STEP in error)) {
        const self = this as unknown as { _results?: unknown };
        const results = Array.isArray(self._results) ? self._results : [self._results];
        const done = results.filter((result) => (result as { command?: unknown })?.command).length;
        Object.defineProperty(error, FAILED_STEP, { value: done, configurable: true });
      }
      super.handleError(error, connection);
    }

    prepare(connection: PgConnection): void {
      let values: unknown[][];
      try {
        // Mapped before anything is written: a value pg cannot send fails the whole pipeline,
        // with nothing of it sent.
        values = this.steps.map((step) => (step.values ?? []).map((value) => prepareValue(value)));
      } catch (error) {
        connection.sync();
        this.handleError(error, connection);
        return;
      }
      this.steps.forEach((step, index) => {
        const prepared = step.name !== undefined && connection.parsedStatements[step.name];
        if (!prepared) connection.parse({ text: step.text, name: '', types: [] });
        connection.bind({
          portal: '',
          statement: prepared ? step.name : '',
          values: values[index],
        });
        connection.describe({ type: 'P', name: '' });
        connection.execute({ portal: '', rows: 0 });
      });
      connection.sync();
    }
  }
  pipelinedQueryClass = PipelinedQuery;
  return pipelinedQueryClass;
}

/**
 * Whether the steps must go one by one: `client` is in `pg`'s own pipeline mode (which refuses
 * query classes of others), or a step names a statement the connection has not prepared yet
 * (`pg` prepares it, and keeps its name, only through its own query).
 */
function oneByOne(client: PoolClient, steps: readonly PipelineStep[]): boolean {
  if ((client as { pipeline?: unknown }).pipeline === true) return true;
  const parsed = (client as unknown as { connection?: Partial<PgConnection> }).connection
    ?.parsedStatements;
  if (!parsed) return true;
  return steps.some((step) => step.name !== undefined && !parsed[step.name]);
}

/**
 * Runs `steps` in order in one round trip, resolving with one result per step; rejects with the
 * first error (the steps after it did not run). Steps naming a statement the connection has not
 * prepared yet go one by one, the first time.
 */
export function runPipeline(
  client: PoolClient,
  steps: readonly PipelineStep[],
): Promise<QueryResult[]> {
  if (steps.length === 1 || oneByOne(client, steps)) return runOneByOne(client, steps);
  const PipelinedQuery = pipelinedQuery();
  return new Promise((resolve, reject) => {
    const query = new PipelinedQuery(steps, (error, results) => {
      if (error) {
        reject(error);
        return;
      }
      const all = Array.isArray(results) ? results : [results!];
      if (all.length !== steps.length) {
        reject(new Error(`a pipeline of ${steps.length} statements gave ${all.length} results`));
        return;
      }
      resolve(all);
    });
    void (client.query as (query: object) => unknown)(query);
  });
}

async function runOneByOne(
  client: PoolClient,
  steps: readonly PipelineStep[],
): Promise<QueryResult[]> {
  const results: QueryResult[] = [];
  for (const step of steps) {
    try {
      results.push(
        await client.query(
          step.name === undefined
            ? { text: step.text, values: step.values as unknown[] }
            : { name: step.name, text: step.text, values: step.values as unknown[] },
        ),
      );
    } catch (error) {
      if (error !== null && typeof error === 'object' && !(FAILED_STEP in error)) {
        Object.defineProperty(error, FAILED_STEP, { value: results.length, configurable: true });
      }
      throw error;
    }
  }
  return results;
}
