import { kindOf } from '../core/option-keys';
import { nullOptionProblem } from '../options/option-keys';

/**
 * The `channels` option of `SequenceServer`: the options given, by channel name. Adds a problem
 * for each channel whose options are null or not an object (an empty key in a config file), and
 * for a `resequence` given as null: either would otherwise consume the channel on the module's
 * defaults, in no particular order, without a word; and for an option beside `resequence` that
 * its resequencer does not take, or takes inside it too. The options within are checked where
 * the channel is consumed, as a decorator's are.
 */
export function channelsOption<T extends object>(
  problems: string[],
  given: Readonly<Record<string, T>> | undefined,
): Readonly<Record<string, T>> {
  if (given === undefined) return {};
  if (typeof given !== 'object' || given === null || Array.isArray(given)) {
    const problem =
      given === null
        ? nullOptionProblem('channels')
        : `channels must be an object of channel options by channel name, got ${kindOf(given)}`;
    // A null `channels` of a plain options object is reported already, with the other keys.
    if (!problems.includes(problem)) problems.push(problem);
    return {};
  }
  for (const [channel, options] of Object.entries(given) as [string, unknown][]) {
    const path = `channels.${channel}`;
    if (options === null) problems.push(nullOptionProblem(path));
    else if (typeof options !== 'object' || Array.isArray(options)) {
      problems.push(`${path} must be an object of channel options, got ${kindOf(options)}`);
    } else if ((options as { resequence?: unknown }).resequence === null) {
      problems.push(nullOptionProblem(`${path}.resequence`));
    } else {
      orderedChannelProblems(problems, path, options as Record<string, unknown>);
    }
  }
  return given;
}

/** The options of a channel's consumer its resequencer takes too, given beside `resequence`. */
const ORDERED_CHANNEL_KEYS = ['prefetch', 'deadLetterChannel', 'handlerRetry', 'handlerTimeoutMs'];

/**
 * A resequenced channel's options beside `resequence` go to its resequencer: those it takes, each
 * given once. Any other (a `sequence` limit, `deleteAfter`, a typo) would be dropped unused.
 */
function orderedChannelProblems(
  problems: string[],
  path: string,
  options: Record<string, unknown>,
): void {
  const resequence = options.resequence;
  if (typeof resequence !== 'object' || resequence === null) return;
  for (const [key, value] of Object.entries(options)) {
    if (key === 'resequence' || value === undefined) continue;
    if (!ORDERED_CHANNEL_KEYS.includes(key)) {
      problems.push(
        `${path}.${key} does not apply to a resequenced channel; beside resequence it takes ` +
          `${ORDERED_CHANNEL_KEYS.join(', ')}`,
      );
    } else if ((resequence as Record<string, unknown>)[key] !== undefined) {
      problems.push(`${path}.${key} is given both beside and inside resequence: give it once`);
    }
  }
}
