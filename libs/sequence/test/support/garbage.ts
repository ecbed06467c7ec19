import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * V8's `gc()`, for tests that check what memory is let go: exposed at run time, since Jest does
 * not start Node with `--expose-gc`.
 */
export function exposedGc(): () => void {
  setFlagsFromString('--expose-gc');
  return runInNewContext('gc') as () => void;
}
