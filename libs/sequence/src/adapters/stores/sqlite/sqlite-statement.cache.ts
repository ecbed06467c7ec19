import type { Database, Statement } from 'better-sqlite3';

/**
 * Prepared statements by SQL text, the most recently used kept (preparing costs more than
 * running a small statement). Bounded, because the texts come from the application's code and
 * a caller that builds SQL with values in it would otherwise grow it without end.
 */
export class SqliteStatementCache {
  private readonly statements = new Map<string, Statement<unknown[]>>();

  constructor(
    private readonly database: Database,
    private readonly capacity = 100,
  ) {}

  get(sql: string): Statement<unknown[]> {
    let statement = this.statements.get(sql);
    if (statement) {
      // Map order is insertion order: moving it to the end marks it most recently used.
      this.statements.delete(sql);
    } else {
      statement = this.database.prepare<unknown[]>(sql);
      if (this.statements.size >= this.capacity) {
        const oldest = this.statements.keys().next().value as string;
        this.statements.delete(oldest);
      }
    }
    this.statements.set(sql, statement);
    return statement;
  }

  get size(): number {
    return this.statements.size;
  }
}
