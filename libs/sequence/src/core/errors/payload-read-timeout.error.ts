import { SequenceError } from './sequence.error';

/** What a payload read was waiting on when its store stopped answering. */
export type PayloadReadStep =
  /** The payload's metadata (its `head`), before its bytes are read. */
  | 'head'
  /** The store's stream of the payload (its `get`). */
  | 'open'
  /** The next chunk of a stream already open. */
  | 'next chunk';

const WAITING_FOR: Record<PayloadReadStep, string> = {
  head: 'answer for payload',
  open: 'open payload',
  'next chunk': 'send the next chunk of payload',
};

/**
 * A payload store did not answer one step of a read within `claimCheck.readTimeoutMs`: a stalled
 * GET, a server that stopped replying mid-read. The read was abandoned and what it opened
 * destroyed. Not a verdict on the payload: a message is requeued as for any store outage, and
 * dead-lettered `store-unavailable` once requeued `tuning.maxStoreRequeues` times.
 */
export class PayloadReadTimeoutError extends SequenceError {
  readonly code = 'payload-read-timeout' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
    readonly waitingFor: PayloadReadStep,
    readonly timeoutMs: number,
  ) {
    super(
      `the ${store} payload store did not ${WAITING_FOR[waitingFor]} ${JSON.stringify(ref)} ` +
        `within ${timeoutMs} ms (claimCheck.readTimeoutMs); the read was abandoned`,
    );
  }
}
