import type { HeaderMap } from '../core/headers';

/**
 * One fragment as a `@SequencedHandler({ mode: 'stream' })` handler receives it: its sequence's
 * fragments arrive in position order, each once, as soon as they are contiguous — the handler can
 * work on a study while the rest of it is still on its way.
 */
export class StreamedFragment {
  constructor(
    readonly sequenceId: string,
    /** 1-based; the handler sees 1, 2, 3, … with no hole and no repeat. */
    readonly position: number,
    /** True on the last fragment: the handler sees it only if the sequence is whole (see `verified`). */
    readonly last: boolean,
    /** The fragment's bytes, CRC-32 checked. */
    readonly body: Buffer,
    /** The producer's own headers (the wire contract's removed). */
    readonly headers: Readonly<HeaderMap>,
    /** Number of fragments, when the producer knew it on this fragment. */
    readonly size: number | undefined,
    /** Total payload bytes, when the producer declared them. */
    readonly totalBytes: number | undefined,
    readonly contentType: string | undefined,
    /**
     * On the last fragment: `true` when this instance hashed every fragment, in order, and the
     * SHA-256 matched the producer's (a mismatch is never delivered: the last fragment is
     * dead-lettered `integrity-mismatch`); `false` when it could not check, because part of the
     * sequence went through another instance (or before a restart). `undefined` on other fragments.
     */
    readonly verified: boolean | undefined,
  ) {}
}
