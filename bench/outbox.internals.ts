/**
 * The one thing bench:outbox takes from the library's internals, not its public entry points:
 * the relay's default concurrency, echoed in the result line when BENCH_OUTBOX_CONCURRENCY is
 * unset.
 */
import { DEFAULTS } from '../libs/sequence/src/options/defaults';

export const DEFAULT_RELAY_CONCURRENCY = DEFAULTS.outbox.outboxes.concurrency;
