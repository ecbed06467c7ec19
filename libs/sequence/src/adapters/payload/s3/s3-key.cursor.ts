import type { S3Client } from '@aws-sdk/client-s3';
import { s3Sdk } from './s3-sdk';

/** Where a listing starts and how it pages. */
export interface KeyListing {
  readonly client: S3Client;
  readonly bucket: string;
  readonly prefix: string;
  readonly pageSize: number;
  /** Only keys after this one (S3's `StartAfter`). */
  readonly startAfter?: string;
}

/**
 * The keys under a prefix, in the order S3 lists them (ascending UTF-8 bytes; for the ASCII keys
 * of this store that is JavaScript's string order), one `ListObjectsV2` request per page, fetched
 * only as the caller advances.
 */
export async function* listKeys(listing: KeyListing): AsyncGenerator<string, void, undefined> {
  const { ListObjectsV2Command } = s3Sdk();
  let continuationToken: string | undefined;
  do {
    const page = await listing.client.send(
      new ListObjectsV2Command({
        Bucket: listing.bucket,
        Prefix: listing.prefix,
        MaxKeys: listing.pageSize,
        ...(continuationToken === undefined
          ? { StartAfter: listing.startAfter }
          : { ContinuationToken: continuationToken }),
      }),
    );
    for (const object of page.Contents ?? []) {
      if (object.Key !== undefined) yield object.Key;
    }
    continuationToken = page.IsTruncated ? page.NextContinuationToken : undefined;
  } while (continuationToken !== undefined);
}

/**
 * Answers "is this key listed?" for keys asked in ascending order, walking the listing once: a
 * merge join against another ordered listing, at one request per page whatever the number of
 * questions.
 */
export class SortedKeyCursor {
  private readonly keys: AsyncGenerator<string, void, undefined>;
  private current: string | undefined;
  private exhausted = false;

  constructor(listing: KeyListing) {
    this.keys = listKeys(listing);
  }

  /** Whether `key` is listed. Each call must ask for a key after the previous one's. */
  async has(key: string): Promise<boolean> {
    while (!this.exhausted && (this.current === undefined || this.current < key)) {
      const next = await this.keys.next();
      if (next.done) this.exhausted = true;
      else this.current = next.value;
    }
    return this.current === key;
  }

  /** Stops the listing; no further request is made. */
  async close(): Promise<void> {
    await this.keys.return();
  }
}
