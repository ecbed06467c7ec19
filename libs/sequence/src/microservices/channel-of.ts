/**
 * The `channelOf` option of `SequenceServer` and `SequenceClient`: the function given, or the
 * identity (a pattern is consumed from, and sent to, the channel of its own name). Adds a problem
 * when it is not a function.
 */
export function channelOfOption(
  problems: string[],
  given: ((pattern: string) => string) | undefined,
): (pattern: string) => string {
  if (given === undefined) return (pattern) => pattern;
  if (typeof given !== 'function') {
    problems.push('channelOf must be a function from a pattern to a channel name');
  }
  return given;
}
