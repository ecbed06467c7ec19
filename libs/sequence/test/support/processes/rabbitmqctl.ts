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

/**
 * Has the broker close each connection listed under `match` (its `name`, `<client> -> <broker>`,
 * or the client property `connection_name`), with `reason`, in one rabbitmqctl call: `eval`
 * starts one Erlang node where `list_connections` then `close_connection` start two. Answers how
 * many connections it closed.
 */
export async function closeConnectionsWhere(
  match: { readonly name: string } | { readonly connectionName: string },
  reason: string,
): Promise<number> {
  const literal = (text: string) => {
    if (!/^[\w .:>\-[\]]*$/.test(text)) throw new Error(`cannot quote ${text} for rabbitmqctl`);
    return `"${text}"`;
  };
  const matches =
    'name' in match
      ? `rabbit_networking:connection_info(P, [name]) =:= [{name, <<${literal(match.name)}>>}]`
      : `lists:member({<<"connection_name">>, longstr, <<${literal(match.connectionName)}>>}, ` +
        'proplists:get_value(client_properties, ' +
        'rabbit_networking:connection_info(P, [client_properties]), []))';
  const stdout = await rabbitmqctl([
    'eval',
    `Ps = [P || P <- rabbit_networking:connections(), ${matches}], ` +
      `[rabbit_networking:close_connection(P, ${literal(reason)}) || P <- Ps], length(Ps).`,
  ]);
  return Number(stdout.trim());
}
