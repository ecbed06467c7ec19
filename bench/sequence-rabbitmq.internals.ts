/**
 * The one thing bench:sequence takes from the library's internals, not its public entry points:
 * the defaults of `prefetch` and `publish.inFlight`, which the raw path (a) uses as well, so that
 * both paths run with the same settings unless BENCH_PREFETCH / BENCH_IN_FLIGHT say otherwise.
 */
import { DEFAULTS } from '../libs/sequence/src/options/defaults';

export const LIBRARY_DEFAULTS = {
  prefetch: DEFAULTS.prefetch,
  inFlight: DEFAULTS.publish.inFlight,
};
