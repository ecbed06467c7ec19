import { Inject, Injectable } from '@nestjs/common';
import { InvalidPayloadRefError } from '../core/errors/invalid-payload-ref.error';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { payloadHeadWithin } from '../claim-check/payload-parking';
import {
  CLAIM_CHECK_STORES,
  PAYLOAD_READ_TIMEOUT_MS,
  type ClaimCheckStores,
} from '../kernel/tokens';
import type { PayloadInfo, PayloadStore } from '../ports/payload-store.port';

/** A claim-check payload's status by ref. */
export interface ClaimStatus {
  readonly ref: string;
  /** `stored`: parked, its ticket not published yet (or never); `published`: ticket sent. */
  readonly status: 'stored' | 'published' | 'not-found';
  /** The payload store holding it. */
  readonly store?: string;
  readonly bytes?: number;
  readonly createdAt?: number;
  readonly expiresAt?: number;
  readonly contentType?: string;
}

/** Claim-check payloads, through the payload stores tickets may name. */
@Injectable()
export class ClaimsReader {
  constructor(
    @Inject(CLAIM_CHECK_STORES) private readonly claimCheck: ClaimCheckStores,
    /** `claimCheck.readTimeoutMs`. */
    @Inject(PAYLOAD_READ_TIMEOUT_MS) private readonly readTimeoutMs: number,
  ) {}

  /**
   * `ref` alone, or `<store>:<ref>` as a ticket's identity names it.
   *
   * @throws the error of a store that could not be asked (down, its bucket gone, or no answer
   *   within `claimCheck.readTimeoutMs`: PayloadReadTimeoutError), when no other store holds the
   *   ref: that store has not said the payload is gone
   */
  async status(ref: string): Promise<ClaimStatus> {
    const asked = this.candidates(ref).map(async ([name, store]) => {
      const info = await this.head(store, strip(ref, name));
      return info && describe(ref, name, info);
    });
    // The first store that answers it holds the ref wins: one that does not answer (bounded by
    // readTimeoutMs) holds up none of the others.
    const found = await firstFound(asked);
    if (found) return found;
    const failed = (await Promise.allSettled(asked)).find((each) => each.status === 'rejected');
    if (failed) throw failed.reason;
    return { ref, status: 'not-found' };
  }

  private candidates(ref: string) {
    const named = [...this.claimCheck.stores].filter(([name]) => ref.startsWith(`${name}:`));
    return named.length > 0 ? named : [...this.claimCheck.stores];
  }

  /**
   * A ref no store could have made, or one a store says it does not hold (the refusals the
   * payload store conformance suite allows for `head`), is not found, not an error.
   */
  private async head(store: PayloadStore, ref: string): Promise<PayloadInfo | undefined> {
    try {
      return await payloadHeadWithin(store, ref, this.readTimeoutMs);
    } catch (error) {
      if (error instanceof InvalidPayloadRefError || error instanceof ClaimCheckNotFoundError) {
        return undefined;
      }
      throw error;
    }
  }
}

/** The first of `answers` to fulfil with a value; undefined once all settled without one. */
function firstFound<T>(answers: ReadonlyArray<Promise<T | undefined>>): Promise<T | undefined> {
  return new Promise((resolve) => {
    let left = answers.length;
    if (left === 0) resolve(undefined);
    for (const answer of answers) {
      answer
        .then(
          (value) => {
            if (value !== undefined) resolve(value);
          },
          () => undefined,
        )
        .finally(() => {
          left -= 1;
          if (left === 0) resolve(undefined);
        });
    }
  });
}

function strip(ref: string, store: string): string {
  return ref.startsWith(`${store}:`) ? ref.slice(store.length + 1) : ref;
}

function describe(ref: string, store: string, info: PayloadInfo): ClaimStatus {
  return {
    ref,
    status: info.published ? 'published' : 'stored',
    store,
    bytes: info.bytes,
    createdAt: info.createdAt,
    expiresAt: info.expiresAt,
    contentType: info.contentType,
  };
}
