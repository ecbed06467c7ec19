/**
 * An environment variable of the demo is set to something it cannot use. Commands catch it and
 * exit with a usage error: the message says which variable is wrong and what to set instead.
 */
export class DemoEnvironmentError extends Error {
  override readonly name = 'DemoEnvironmentError';

  constructor(
    /** The variables at fault. */
    readonly variables: readonly string[],
    /** One line per problem, each naming its variable. */
    readonly problems: readonly string[],
  ) {
    super(problems.join('\n'));
  }
}
