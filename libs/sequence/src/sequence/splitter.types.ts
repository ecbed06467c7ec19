import type { HeaderMap } from '../core/headers';
import type { PublishPolicy } from '../options/module-options';

export interface SendOptions {
  /** @default a random UUID */
  sequenceId?: string;
  /** Largest fragment body. @default the module's `fragmentBytes` */
  fragmentBytes?: number;
  /** Your headers, copied onto every fragment and handed to the handler. */
  headers?: HeaderMap;
  /** Of the whole payload. */
  contentType?: string;
  /** Of the whole payload. */
  contentEncoding?: string;
  /** Overrides the module's confirm timeout and retry policy for this send. */
  publish?: PublishPolicy;
  /**
   * `'claim-check'`: each fragment body is parked in the Claim Check payload store and its
   * message carries only a signed ticket (`x-claim-check: 1`) with the usual fragment headers,
   * so the broker moves small messages only. The consumer resolves each ticket before storing
   * the fragment, then deletes the parked body (claimCheck.deleteAfter). @default 'broker'
   */
  via?: 'broker' | 'claim-check';
  /**
   * `'broker'`: the fragments go to the partition of the channel their sequence id hashes to
   * (`partitionIndex`), for consumers that hold them in the broker until the sequence completes
   * (see docs/message-sequence.md, "Broker-held reassembly"). Needs a transport with partitioned
   * channels. @default the module's `sequence.buffer`
   */
  buffer?: 'store' | 'broker';
  /** How many partitions the channel has, with `buffer: 'broker'`. @default the module's `sequence.partitions` */
  partitions?: number;
}

/** What a completed `send` reports. */
export interface SequenceReceipt {
  readonly channel: string;
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  /** SHA-256 of the whole payload, lowercase hex. */
  readonly sha256: string;
}
