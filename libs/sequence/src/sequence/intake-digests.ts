import type { Hash } from 'node:crypto';
import { sha256Hasher } from '../core/checksum';

/** SHA-256 and length of a payload. */
export interface PayloadDigest {
  readonly sha256: string;
  readonly bytes: number;
}

interface RunningDigest {
  /** The position the next fragment must have to join the digest. */
  next: number;
  readonly hash: Hash;
  bytes: number;
  /** A fragment of it was not stored by its delivery here: the digest cannot be trusted. */
  broken: boolean;
  /** Settles after every fragment enrolled so far was hashed (or the digest broke). */
  settled: Promise<void>;
}

/**
 * Running SHA-256 digests of sequences whose fragments this instance receives in order, so
 * that a sequence completed here need not be read back from the store once just to verify it.
 *
 * A fragment joins its sequence's digest only when it arrives as the next position, and its bytes
 * are hashed only once its own delivery stored it (`stored` resolves true): the digest then covers
 * exactly the bodies the store holds, in order. Anything else — a gap, a duplicate, a redelivery,
 * a fragment stored by another instance, a copy that only took a complete sequence over (the
 * body held at its position may be another), a failed store call — drops the digest, and the
 * sequence is verified by reading it back as before. Hashing waits for the store in arrival
 * order, so it holds no body longer than its own store call does.
 *
 * At most `capacity` digests are open (a hash state is a few hundred bytes); when full, the
 * oldest is dropped, which only costs that sequence the fast path.
 */
export class IntakeDigests {
  private readonly open = new Map<string, RunningDigest>();

  constructor(private readonly capacity: number) {}

  /** Offers a fragment that arrived; `stored` says whether its delivery stored its body. */
  follow(
    scope: string,
    sequenceId: string,
    position: number,
    body: Buffer,
    stored: Promise<boolean>,
  ): void {
    const key = digestKey(scope, sequenceId);
    let digest = this.open.get(key);
    if (!digest) {
      if (position !== 1 || this.capacity === 0) return;
      digest = {
        next: 1,
        hash: sha256Hasher(),
        bytes: 0,
        broken: false,
        settled: Promise.resolve(),
      };
      this.makeRoom();
      this.open.set(key, digest);
    }
    if (position !== digest.next) {
      this.open.delete(key);
      return;
    }
    digest.next++;
    const running = digest;
    running.settled = running.settled
      .then(() => stored)
      .then(
        (wasStored) => {
          if (running.broken) return;
          if (wasStored) {
            running.hash.update(body);
            running.bytes += body.length;
            return;
          }
          this.drop(key, running);
        },
        () => this.drop(key, running),
      );
  }

  /**
   * The digest of a sequence whose `fragments` are all stored, when this instance hashed every
   * one of them in order; otherwise undefined. Either way the sequence is forgotten here.
   */
  async take(
    scope: string,
    sequenceId: string,
    fragments: number,
  ): Promise<PayloadDigest | undefined> {
    const key = digestKey(scope, sequenceId);
    const digest = this.open.get(key);
    if (!digest) return undefined;
    this.open.delete(key);
    await digest.settled;
    if (digest.broken || digest.next - 1 !== fragments) return undefined;
    return { sha256: digest.hash.digest('hex'), bytes: digest.bytes };
  }

  /** Digests open now (for tests and metrics). */
  get size(): number {
    return this.open.size;
  }

  private drop(key: string, digest: RunningDigest): void {
    digest.broken = true;
    if (this.open.get(key) === digest) this.open.delete(key);
  }

  private makeRoom(): void {
    while (this.open.size >= this.capacity) {
      const oldest = this.open.keys().next();
      if (oldest.done) return;
      this.open.delete(oldest.value);
    }
  }
}

function digestKey(scope: string, sequenceId: string): string {
  // A NUL cannot occur in a sequence id (the wire contract limits its characters).
  return `${scope}\u0000${sequenceId}`;
}
