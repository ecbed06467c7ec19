import { kindOf } from '../core/option-keys';
import { nullOptionProblem } from '../options/option-keys';

/**
 * The `channels` option of `SequenceServer`: the options given, by channel name. Adds a problem
 * for each channel whose options are null or not an object (an empty key in a config file), and
 * for a `resequence` given as null: either would otherwise consume the channel on the module's
 * defaults, in no particular order, without a word. The options within are checked where the
 * channel is consumed, as a decorator's are.
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
    }
  }
  return given;
}
