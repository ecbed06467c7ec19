import { Client } from 'pg';
import { SERVERS } from './servers';

/**
 * Runs `sql` on a connection of its own to the test PostgreSQL (as an operator would, outside any
 * pool under test) and returns its rows.
 */
export async function adminQuery<Row>(sql: string, params: unknown[] = []): Promise<Row[]> {
  const client = new Client({ connectionString: SERVERS.postgres.url });
  await client.connect();
  try {
    return (await client.query(sql, params)).rows as Row[];
  } finally {
    await client.end();
  }
}
