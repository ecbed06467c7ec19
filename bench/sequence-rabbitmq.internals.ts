/**
 * What bench:sequence takes from the library's internals, not its public entry points: the
 * defaults of `prefetch` and `publish.inFlight`, which the raw path (a) uses as well, so that
 * both paths run with the same settings unless BENCH_PREFETCH / BENCH_IN_FLIGHT say otherwise;
 * and the room the NATS transport and the module keep for headers, which sets the largest
 * fragment on NATS.
 */
import { HEADER_OVERHEAD_BYTES } from '../libs/sequence/src/adapters/transports/nats/nats.headers';
import { DEFAULTS } from '../libs/sequence/src/options/defaults';

export const LIBRARY_DEFAULTS = {
  prefetch: DEFAULTS.prefetch,
  inFlight: DEFAULTS.publish.inFlight,
  partitions: DEFAULTS.sequence.partitions,
  window: DEFAULTS.sequence.window,
};

/** NATS's default `max_payload`. */
const NATS_MAX_PAYLOAD = 1024 * 1024;

/**
 * The fragment size (in MiB) the module derives on a NATS server of the default max_payload:
 * the transport's `maxMessageBytes` less the module's `headerAllowanceBytes`.
 */
export function largestNatsFragmentMiB(): number {
  const bytes = NATS_MAX_PAYLOAD - HEADER_OVERHEAD_BYTES - DEFAULTS.tuning.headerAllowanceBytes;
  return bytes / (1024 * 1024);
}
