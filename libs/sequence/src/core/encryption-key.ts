/** One AES-256 key for payloads at rest. */
export interface PayloadEncryptionKey {
  /**
   * Written in the header of every payload it encrypts, so that the reader picks the right key:
   * a name, never secret (1–64 of `[A-Za-z0-9._:-]`).
   */
  readonly id: string;
  /**
   * 32 random bytes: a Buffer, or their base64 (or base64url) text, e.g. the output of
   * `openssl rand -base64 32`. Not a passphrase: strings are decoded, never hashed.
   */
  readonly key: Buffer | string;
}
