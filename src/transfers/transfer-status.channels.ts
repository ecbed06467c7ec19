/**
 * The instant-payment (PIX) transfer statuses: what travels, in which order, on which channels.
 *
 * Upstream services publish each status of a transfer to the shuffled channel with
 * `x-resequence-key` = the transfer id and `x-resequence-seq` = the status's place in
 * {@link TRANSFER_STATUSES}; the resequencer publishes them again, each transfer's in that order,
 * to the ordered channel.
 */

/** Where the upstream services publish statuses, in whatever order they happen to send them. */
export const SHUFFLED_CHANNEL = 'pix-status-shuffled';
/** Where the resequencer publishes them again, each transfer's statuses in sequence. */
export const ORDERED_CHANNEL = 'pix-status-ordered';

/** A transfer's statuses, in the order they happen: `seq` is the position here, from 1. */
export const TRANSFER_STATUSES = ['initiated', 'processing', 'settled'] as const;

export type TransferStatus = (typeof TRANSFER_STATUSES)[number];

/** The last status: a transfer that reached it is done. */
export const FINAL_STATUS: TransferStatus = 'settled';

/** The sequence number of `status`: initiated = 1, processing = 2, settled = 3. */
export function seqOf(status: TransferStatus): number {
  return TRANSFER_STATUSES.indexOf(status) + 1;
}

/** The status of sequence number `seq`, or undefined when it names none. */
export function statusOf(seq: number): TransferStatus | undefined {
  return TRANSFER_STATUSES[seq - 1];
}

/** The body of one status message (JSON). */
export interface TransferStatusMessage {
  readonly transferId: string;
  readonly status: TransferStatus;
  /** When the upstream service recorded the status (ISO 8601). */
  readonly at: string;
  /** Which upstream service published it. */
  readonly source: string;
  /** Amount in cents, as the payer's bank initiated it. */
  readonly amountCents: number;
}

/** The two channel names of one run: `prefix` keeps runs that share a broker apart (tests). */
export interface TransferChannels {
  readonly shuffled: string;
  readonly ordered: string;
}

export function transferChannels(prefix = ''): TransferChannels {
  return { shuffled: `${prefix}${SHUFFLED_CHANNEL}`, ordered: `${prefix}${ORDERED_CHANNEL}` };
}
