import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const execFileAsync = promisify(execFile);

/** Runs `rabbitmqctl` with `args` and returns what it printed (about a second: it starts an Erlang node). */
export async function rabbitmqctl(args: readonly string[]): Promise<string> {
  const { stdout } = await execFileAsync('rabbitmqctl', [...args]);
  return stdout;
}

/**
 * `rabbitmqctl <list> <columns…>` (`list_queues`, `list_connections`, ...) as rows of cells in the
 * columns' order: its output without the header line, one row per line, cells separated by tabs.
 */
export async function rabbitmqctlRows(
  list: string,
  columns: readonly string[],
): Promise<string[][]> {
  const stdout = await rabbitmqctl([list, ...columns, '-q', '--no-table-headers']);
  return stdout
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => line.split('\t').map((cell) => cell.trim()));
}
