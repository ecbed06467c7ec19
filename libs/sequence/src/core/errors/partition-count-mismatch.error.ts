import { SequenceError } from './sequence.error';

/**
 * A partitioned channel was declared with one partition count and is published to, or subscribed
 * to, with another: producers and consumers of a channel must agree on its `partitions`. A
 * publish refused so sends nothing and is not retried (a final refusal, see the Transport port):
 * only a change of configuration helps.
 */
export class PartitionCountMismatchError extends SequenceError {
  readonly code = 'partition-count-mismatch' as const;
  readonly finalRefusal = true as const;

  constructor(
    readonly channel: string,
    /** The count this call asked for. */
    readonly requested: number,
    /** The count the channel was declared with, when the broker tells it. */
    readonly declared?: number,
  ) {
    super(
      `${channel} is partitioned ${declared === undefined ? 'with another count' : `${declared} ways`}` +
        `, not ${requested}: every producer and consumer of a channel must use the same ` +
        `partitions (to change it, drain the channel and delete its partitions first)`,
    );
  }
}
