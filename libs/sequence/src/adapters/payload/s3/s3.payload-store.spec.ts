import {
  CreateBucketCommand,
  DeleteObjectCommand,
  ListObjectsV2Command,
  S3Client,
} from '@aws-sdk/client-s3';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { setTimeout as delay } from 'node:timers/promises';
import {
  describePayloadStoreConformance,
  digestOf,
  digestOfBuffer,
  generatedSource,
} from '../../../testing/conformance/payload-store.conformance';
import {
  S3RVER_CREDENTIALS as CREDENTIALS,
  startS3rver,
  type S3rverProcess,
} from '../../../../test/support/processes/s3rver';
import { InvalidPayloadRefError } from '../../../core/errors/invalid-payload-ref.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import type { PayloadStore, PutOptions } from '../../../ports/payload-store.port';
import { EncryptingPayloadStore } from '../encrypting/encrypting.payload-store';
import { eventually } from '../../../../test/support/sequence-test-app';
import { S3PayloadStore } from './s3.payload-store';
import { S3MetadataTooLargeError } from './s3-metadata-too-large.error';
import type { S3PayloadStoreOptions } from './s3.payload-store.options';

const MIB = 1024 * 1024;
const MINUTE = 60_000;
const BUCKET = 'nseq-payloads';
/** A bucket where the server keeps s3rver's own answer to AbortMultipartUpload: 405. */
const NO_ABORT_BUCKET = 'nseq-no-abort';

/** What the client sent, seen by a middleware: commands, keys, and UploadParts at once. */
class Traffic {
  sent: { readonly command: string; readonly key?: string }[] = [];
  partsUploading = 0;
  mostPartsUploading = 0;
  /** Bytes of the UploadParts that S3 acknowledged. */
  partBytesDone = 0;
  /** Runs as each UploadPart starts. */
  onUploadPart: () => Promise<void> | void = () => undefined;
  /**
   * Runs once S3 has answered the PutObject or CompleteMultipartUpload of a payload (not of a
   * marker), before the store hears of it: the instant the payload becomes visible to a sweep.
   */
  onPayloadStored: () => Promise<void> | void = () => undefined;

  observe(client: S3Client): void {
    client.middlewareStack.add(
      (next, context) => async (args) => {
        const command = context.commandName ?? 'unknown';
        const key = (args.input as { Key?: string }).Key;
        this.sent.push({ command, key });
        const storesPayload =
          (command === 'PutObjectCommand' || command === 'CompleteMultipartUploadCommand') &&
          key?.includes('/payloads/');
        if (storesPayload) {
          const output = await next(args);
          await this.onPayloadStored();
          return output;
        }
        if (command !== 'UploadPartCommand') return next(args);
        this.mostPartsUploading = Math.max(this.mostPartsUploading, ++this.partsUploading);
        try {
          await this.onUploadPart();
          const output = await next(args);
          this.partBytesDone += (args.input as { ContentLength: number }).ContentLength;
          return output;
        } finally {
          this.partsUploading -= 1;
        }
      },
      { step: 'initialize', name: 'observeTraffic' },
    );
  }

  reset(): void {
    this.sent = [];
    this.partsUploading = 0;
    this.mostPartsUploading = 0;
    this.partBytesDone = 0;
    this.onUploadPart = () => undefined;
    this.onPayloadStored = () => undefined;
  }

  count(command: string): number {
    return this.sent.filter((request) => request.command === `${command}Command`).length;
  }
}

describe('S3PayloadStore', () => {
  let server: S3rverProcess;
  let client: S3Client;
  const traffic = new Traffic();
  /** Where each store of the tests writes, to empty it afterwards. */
  const places = new WeakMap<
    S3PayloadStore,
    { readonly bucket: string; readonly prefix: string }
  >();

  beforeAll(async () => {
    server = await startS3rver({ noAbortBucket: NO_ABORT_BUCKET });
    client = new S3Client({
      endpoint: server.endpoint,
      region: 'us-east-1',
      forcePathStyle: true,
      credentials: CREDENTIALS,
    });
    traffic.observe(client);
    await client.send(new CreateBucketCommand({ Bucket: BUCKET }));
    await client.send(new CreateBucketCommand({ Bucket: NO_ABORT_BUCKET }));
  });

  afterAll(async () => {
    client?.destroy();
    await server?.stop();
  });

  function storeOf(options: Partial<S3PayloadStoreOptions> = {}): S3PayloadStore {
    const place = { bucket: options.bucket ?? BUCKET, prefix: `spec/${randomUUID()}/` };
    const store = new S3PayloadStore(client, { ...options, ...place });
    places.set(store, place);
    return store;
  }

  const prefixOf = (store: S3PayloadStore): string => places.get(store)!.prefix;

  async function keysUnder(prefix: string, bucket = BUCKET): Promise<string[]> {
    const listed = await client.send(new ListObjectsV2Command({ Bucket: bucket, Prefix: prefix }));
    return (listed.Contents ?? []).map((object) => object.Key!);
  }

  async function dispose(store: S3PayloadStore): Promise<void> {
    const { bucket, prefix } = places.get(store)!;
    for (const key of await keysUnder(prefix, bucket)) {
      await client.send(new DeleteObjectCommand({ Bucket: bucket, Key: key }));
    }
    await store.close();
  }

  /** Multipart uploads s3rver holds open in a bucket: one folder of parts each. */
  async function pendingUploads(bucket = BUCKET): Promise<string[]> {
    return readdir(join(server.directory, bucket, '._S3rver_uploads')).catch(() => []);
  }

  describePayloadStoreConformance('S3PayloadStore on s3rver', {
    create: async () => storeOf(),
    close: (store) => dispose(store as S3PayloadStore),
    // A HeadObject of the marker, then the DeleteObject: a mark between the two is not seen.
    atomicDeleteUnpublished: false,
  });

  describe('on s3rver', () => {
    const t0 = Date.UTC(2026, 10, 1);
    const options = (overrides: Partial<PutOptions> = {}): PutOptions => ({
      now: t0,
      expiresAt: t0 + 30 * MINUTE,
      published: false,
      ...overrides,
    });
    let store: S3PayloadStore;

    beforeEach(() => traffic.reset());
    afterEach(() => dispose(store));

    it('deletes an orphan right after reading its marker, and a marked one not at all', async () => {
      store = storeOf();
      const orphan = await store.put(Buffer.from('orphan'), options());
      const marked = await store.put(Buffer.from('marked'), options());
      await store.markPublished(marked.ref);
      traffic.reset();

      expect(await store.deleteUnpublished(orphan.ref)).toBe(true);
      expect(await store.deleteUnpublished(marked.ref)).toBe(false);

      const payloads = `${prefixOf(store)}payloads/`;
      const markers = `${prefixOf(store)}published/`;
      const requests = traffic.sent.map(({ command, key }) => `${command} ${key}`);
      expect(requests.slice(0, 3).sort()).toEqual([
        `DeleteObjectCommand ${payloads}${orphan.ref}`,
        `HeadObjectCommand ${payloads}${orphan.ref}`,
        `HeadObjectCommand ${markers}${orphan.ref}`,
      ]);
      expect(requests[2]).toBe(`DeleteObjectCommand ${payloads}${orphan.ref}`);
      expect(requests.slice(3)).not.toContainEqual(expect.stringMatching(/^DeleteObject/));
      expect(await store.head(marked.ref)).toMatchObject({ published: true });
    });

    it('uploads a stream larger than partBytes in parts, and reads it back whole', async () => {
      store = storeOf({ partBytes: 5 * MIB });
      const source = generatedSource(12 * MIB + 3);

      const { ref, bytes } = await store.put(source.stream, options());

      expect(bytes).toBe(12 * MIB + 3);
      expect(traffic.count('CreateMultipartUpload')).toBe(1);
      expect(traffic.count('UploadPart')).toBe(3);
      expect(traffic.count('CompleteMultipartUpload')).toBe(1);
      expect(traffic.count('PutObject')).toBe(0);
      expect(await digestOf(await store.get(ref))).toEqual(source.digest());
    });

    it('uploads a Buffer larger than partBytes in parts as well', async () => {
      store = storeOf({ partBytes: 5 * MIB });
      const payload = randomBytes(11 * MIB);

      const { ref } = await store.put(payload, options());

      expect(traffic.count('UploadPart')).toBe(3);
      expect(await digestOf(await store.get(ref))).toEqual(digestOfBuffer(payload));
    });

    it('sends a payload of exactly partBytes as one PutObject', async () => {
      store = storeOf({ partBytes: 5 * MIB });

      await store.put(generatedSource(5 * MIB).stream, options());

      expect(traffic.count('PutObject')).toBe(1);
      expect(traffic.count('CreateMultipartUpload')).toBe(0);
    });

    it('uploads at most partsInFlight parts at once and reads the source no further ahead', async () => {
      store = storeOf({ partBytes: 5 * MIB, partsInFlight: 2 });
      const chunkBytes = 64 * 1024;
      let produced = 0;
      let furthestAhead = 0;
      const hash = createHash('sha256');
      const source = Readable.from(
        (function* () {
          while (produced < 40 * MIB) {
            const chunk = randomBytes(chunkBytes);
            hash.update(chunk);
            produced += chunk.length;
            yield chunk;
          }
        })(),
      );
      // A slow server: each part takes 100 ms, so an unbounded reader would race ahead.
      traffic.onUploadPart = async () => {
        furthestAhead = Math.max(furthestAhead, produced - traffic.partBytesDone);
        await new Promise((resolve) => setTimeout(resolve, 100));
      };

      const { ref } = await store.put(source, options());

      expect(traffic.mostPartsUploading).toBe(2);
      // Two parts uploading, one filling, and what Readable.from buffers (16 chunks) plus one.
      expect(furthestAhead).toBeLessThanOrEqual(3 * 5 * MIB + 17 * chunkBytes);
      expect(await digestOf(await store.get(ref))).toEqual({
        bytes: 40 * MIB,
        sha256: hash.digest('hex'),
      });
    });

    it('aborts the multipart upload when the source fails after parts were sent', async () => {
      store = storeOf({ partBytes: 5 * MIB });
      const cause = new Error('camera disconnected');
      const source = generatedSource(20 * MIB, { failAfter: 11 * MIB, failWith: cause });

      await expect(store.put(source.stream, options())).rejects.toBe(cause);

      expect(traffic.count('UploadPart')).toBeGreaterThanOrEqual(2);
      expect(traffic.count('AbortMultipartUpload')).toBe(1);
      expect(await keysUnder(prefixOf(store))).toEqual([]);
      // Not s3rver's uploads directory: a part whose request was on its way as the upload was
      // aborted may still land there and leave the upload's directory behind under load (S3
      // itself refuses a part of an aborted upload). The abort is what the store owes.
    });

    it("rejects with the source's error, not the abort's, when the server refuses the abort", async () => {
      store = storeOf({ bucket: NO_ABORT_BUCKET, partBytes: 5 * MIB });
      const cause = new Error('source failed');
      const source = generatedSource(12 * MIB, { failAfter: 6 * MIB, failWith: cause });

      await expect(store.put(source.stream, options())).rejects.toBe(cause);

      expect(traffic.count('AbortMultipartUpload')).toBe(1);
      expect(await keysUnder(prefixOf(store), NO_ABORT_BUCKET)).toEqual([]);
      expect(await pendingUploads(NO_ABORT_BUCKET)).toHaveLength(1); // s3rver kept the parts
    });

    it.each([
      ['a climb out of the prefix', '../x'],
      ['an absolute path', '/etc/passwd'],
      [
        'a key of another prefix',
        'other/payloads/0190c2b7a000-0190c2b7a000-1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed',
      ],
      ['an uppercase ref', '0190C2B7A000-0190C2B7A000-1B9D6BCD-BBFD-4B2D-9B5D-AB8DFBBD4BED'],
      [
        'a ref with a query string',
        '0190c2b7a000-0190c2b7a000-1b9d6bcd-bbfd-4b2d-9b5d-ab8dfbbd4bed?uploads',
      ],
    ])(
      'refuses %s in get, head, delete and markPublished without sending a request',
      async (_label, ref) => {
        store = storeOf();

        for (const call of [
          () => store.get(ref),
          () => store.head(ref),
          () => store.delete(ref),
          () => store.markPublished(ref),
        ]) {
          await expect(call()).rejects.toBeInstanceOf(InvalidPayloadRefError);
        }

        expect(traffic.sent).toEqual([]);
      },
    );

    it.each([
      ['a Latin-1 letter, sent raw as Content-Type', 'application/dicom; charset=ü', 1024],
      ['a character beyond Latin-1', 'text/plain; name=報告', 1024],
      ['a line break, in a multipart upload', 'text/plain\r\nx-amz-acl: public-read', 6 * MIB],
    ])(
      'refuses a content type with %s before it sends any request, its marker included',
      async (_label, contentType, length) => {
        store = storeOf({ partBytes: 5 * MIB });

        for (const payload of [randomBytes(length), generatedSource(length).stream]) {
          await expect(
            store.put(payload, options({ published: true, contentType })),
          ).rejects.toBeInstanceOf(SequenceOptionsError);
        }

        expect(traffic.sent).toEqual([]);
        expect(await keysUnder(prefixOf(store))).toEqual([]);
      },
    );

    /**
     * S3 keeps at most 2 KB of user metadata per object (keys and values, in UTF-8): over it, the
     * PutObject or CreateMultipartUpload fails, a whole part of the payload read and sent first.
     */
    it.each([
      ['one PutObject', 1024],
      ['a multipart upload', 6 * MIB],
    ])(
      'refuses metadata over S3’s 2 KB before it reads the payload or sends any request (%s)',
      async (_how, length) => {
        store = storeOf({ partBytes: 5 * MIB });
        const metadata = { note: 'x'.repeat(1_600) };
        let read = 0;
        const stream = Readable.from(
          (function* () {
            for (; read < length; read += 64 * 1024) yield randomBytes(64 * 1024);
          })(),
        );

        for (const payload of [randomBytes(length), stream]) {
          const error: unknown = await store
            .put(payload, options({ published: true, metadata }))
            .catch((rejection: unknown) => rejection);
          expect(error).toBeInstanceOf(S3MetadataTooLargeError);
          expect(error).toMatchObject({ code: 's3-metadata-too-large', limit: 2048 });
          expect((error as S3MetadataTooLargeError).bytes).toBeGreaterThan(2048);
          expect((error as Error).message).toMatch(/2048 bytes/);
        }

        expect(read).toBe(0);
        expect(stream.destroyed).toBe(true);
        expect(traffic.sent).toEqual([]);
        expect(await keysUnder(prefixOf(store))).toEqual([]);
      },
    );

    it('stores metadata that just fits S3’s 2 KB, and reads it back', async () => {
      store = storeOf();
      // What S3 counts: each x-amz-meta- header's name (without the prefix) and value.
      const { now, expiresAt } = options();
      const fits = (note: string) =>
        [
          ['nseq-created-at', String(now)],
          ['nseq-expires-at', String(expiresAt)],
          ['nseq-content-type', encodeURIComponent('text/plain')],
          ['nseq-metadata', Buffer.from(JSON.stringify({ note })).toString('base64url')],
        ].reduce((sum, [key, value]) => sum + key.length + value.length, 0) <= 2048;
      let note = '';
      while (fits(`${note}x`)) note += 'x';
      const metadata = { note };

      const { ref } = await store.put(
        Buffer.from('study'),
        options({ contentType: 'text/plain', metadata }),
      );

      expect((await store.head(ref))?.metadata).toEqual(metadata);
      await expect(
        store.put(
          Buffer.from('study'),
          options({ contentType: 'text/plain', metadata: { note: `${note}xxxx` } }),
        ),
      ).rejects.toBeInstanceOf(S3MetadataTooLargeError);
    });

    it('records publication as an empty marker beside the payload; delete removes both', async () => {
      store = storeOf();
      const prefix = prefixOf(store);
      const { ref } = await store.put(Buffer.from('study'), options());

      await store.markPublished(ref);
      expect((await keysUnder(prefix)).sort()).toEqual([
        `${prefix}payloads/${ref}`,
        `${prefix}published/${ref}`,
      ]);

      await store.delete(ref);
      expect(await keysUnder(prefix)).toEqual([]);
    });

    it.each([
      ['one PutObject', 1024],
      ['a multipart upload', 6 * MIB],
    ])(
      'a payload put published (checkIn) is never an orphan candidate, even the instant its upload (%s) completes',
      async (_how, length) => {
        store = storeOf({ partBytes: 5 * MIB });
        const seen: unknown[] = [];
        // A sweep on another instance, an hour past the payload's creation, in the instant the
        // payload becomes listable: the marker must already say it is published.
        traffic.onPayloadStored = async () => {
          seen.push(
            await store.sweepCandidates({
              now: t0 + 1,
              unpublishedBefore: t0 + 60 * MINUTE,
              limit: 10,
            }),
          );
        };

        const { ref } = await store.put(randomBytes(length), options({ published: true }));

        expect(seen).toEqual([[]]);
        expect(await store.head(ref)).toMatchObject({ published: true });
      },
    );

    it('a published put whose upload fails leaves neither payload nor marker', async () => {
      store = storeOf({ partBytes: 5 * MIB });
      const cause = new Error('camera disconnected');
      const source = generatedSource(20 * MIB, { failAfter: 11 * MIB, failWith: cause });

      await expect(store.put(source.stream, options({ published: true }))).rejects.toBe(cause);

      expect(await keysUnder(prefixOf(store))).toEqual([]);
    });

    it('leaves no marker when markPublished finds the payload gone', async () => {
      store = storeOf();
      const { ref } = await store.put(Buffer.from('study'), options());
      await store.delete(ref);

      expect(await store.markPublished(ref)).toBe(false);

      expect(await keysUnder(prefixOf(store))).toEqual([]);
    });

    it('sweeps across listing pages, oldest first, with listings only', async () => {
      store = storeOf({ listPageSize: 2 });
      const put = (overrides: Partial<PutOptions>) =>
        store.put(Buffer.from('x'), options(overrides)).then((stored) => stored.ref);
      const published = await put({ now: t0 - 5 * MINUTE, published: true });
      const orphan = await put({ now: t0 - 4 * MINUTE });
      const expired = await put({ now: t0 - 3 * MINUTE, expiresAt: t0, published: true });
      await put({ now: t0 - 2 * MINUTE, published: true });
      const secondOrphan = await put({ now: t0 - MINUTE });
      await put({ now: t0 + MINUTE }); // unpublished, but within the grace period
      traffic.reset();

      const candidates = await store.sweepCandidates({
        now: t0,
        unpublishedBefore: t0 - MINUTE,
        limit: 10,
      });

      expect(candidates).toEqual([
        { ref: orphan, reason: 'orphaned' },
        { ref: expired, reason: 'expired' },
        { ref: secondOrphan, reason: 'orphaned' },
      ]);
      expect(candidates.map((candidate) => candidate.ref)).not.toContain(published);
      expect(new Set(traffic.sent.map((request) => request.command))).toEqual(
        new Set(['ListObjectsV2Command']),
      );
      // 6 payloads in pages of 2, and the 3 markers (from the first payload past the grace
      // instant on) in pages of 2.
      expect(traffic.sent).toHaveLength(3 + 2);
    });

    it('stops listing once limit candidates were found', async () => {
      store = storeOf({ listPageSize: 2 });
      for (let index = 0; index < 6; index += 1) {
        await store.put(Buffer.from('x'), options({ now: t0 + index, expiresAt: t0 }));
      }
      traffic.reset();

      const candidates = await store.sweepCandidates({ now: t0, unpublishedBefore: 0, limit: 2 });

      expect(candidates).toHaveLength(2);
      expect(traffic.sent).toHaveLength(1);
    });

    it('answers ping, and rejects it when the bucket does not exist', async () => {
      store = storeOf();
      const missing = new S3PayloadStore(client, { bucket: 'nseq-no-such-bucket' });

      await expect(store.ping()).resolves.toBeUndefined();
      await expect(missing.ping()).rejects.toThrow();
    });

    it('rejects head on a bucket that does not exist, as get and delete do, rather than answer gone', async () => {
      store = storeOf();
      const { ref } = await store.put(Buffer.from('x'), options());
      const missing = new S3PayloadStore(client, { bucket: 'nseq-no-such-bucket' });

      await expect(missing.get(ref)).rejects.toThrow();
      await expect(missing.head(ref)).rejects.toThrow(/bucket nseq-no-such-bucket does not exist/);
      // A ref that is not there, in a bucket that is: gone, as before.
      await store.delete(ref);
      await expect(store.head(ref)).resolves.toBeUndefined();
    });

    it('leaves a client passed in usable after close', async () => {
      store = storeOf();
      await store.close();

      await expect(storeOf().ping()).resolves.toBeUndefined();
    });

    it('connects with a client of its own, and closes it (twice harmlessly)', async () => {
      store = storeOf();
      const own = S3PayloadStore.connect({
        endpoint: server.endpoint,
        region: 'us-east-1',
        forcePathStyle: true,
        credentials: CREDENTIALS,
        bucket: BUCKET,
        prefix: prefixOf(store),
      });
      const payload = randomBytes(1_000);

      const { ref } = await own.put(payload, options());

      expect(await digestOf(await own.get(ref))).toEqual(digestOfBuffer(payload));
      await own.close();
      await expect(own.close()).resolves.toBeUndefined();
    });
  });

  describe('on an S3 that accepts connections and never answers', () => {
    let silent: Server;
    const sockets = new Set<Socket>();
    let endpoint: string;
    const ref = '000000000001-0000ffffffff-4b7f2a8e-1c2d-4e5f-8a9b-0c1d2e3f4a5b';

    beforeAll(async () => {
      silent = createServer((socket) => {
        sockets.add(socket);
        socket.on('close', () => sockets.delete(socket));
        socket.resume(); // reads the request, and so sees the client close
      });
      await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
      endpoint = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    });

    afterAll(async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    });

    it.each([
      ['itself', (store: PayloadStore) => store],
      [
        'under the encrypting wrapper',
        (store: PayloadStore) =>
          new EncryptingPayloadStore(store, {
            keys: [{ id: 'k1', key: Buffer.alloc(32, 7).toString('base64') }],
          }),
      ],
    ])(
      '%s: a get stops waiting once its signal aborts, with its reason, and closes its request',
      async (_, wrap) => {
        const inner = S3PayloadStore.connect({
          endpoint,
          region: 'us-east-1',
          forcePathStyle: true,
          bucket: BUCKET,
          credentials: CREDENTIALS,
          client: { maxAttempts: 1 },
        });
        const controller = new AbortController();
        const outcome = wrap(inner)
          .get(ref, { signal: controller.signal })
          .then(
            () => 'resolved',
            (error: Error) => error.message,
          );
        await eventually(() => sockets.size > 0, 'the GetObject request');

        controller.abort(new Error('the handler is over'));
        const settled = await Promise.race([outcome, delay(2_000).then(() => 'still waiting')]);
        await inner.close();

        expect(settled).toBe('the handler is over');
        await eventually(() => sockets.size === 0, 'the request to be closed', 2_000);
      },
    );
  });

  describe('on an S3 that starts multipart uploads and answers nothing else', () => {
    let hanging: HttpServer;
    const sockets = new Set<Socket>();
    /** `METHOD ?query` of each request the server received. */
    let received: string[] = [];
    let endpoint: string;
    const t0 = Date.UTC(2026, 10, 1);
    const putOptions: PutOptions = { now: t0, expiresAt: t0 + 30 * MINUTE, published: false };

    beforeAll(async () => {
      hanging = createHttpServer((request, response) => {
        const url = new URL(request.url ?? '/', 'http://s3');
        received.push(`${request.method} ${url.search}`);
        request.resume(); // reads the body, and so sees the client close
        if (request.method === 'POST' && url.searchParams.has('uploads')) {
          response.setHeader('content-type', 'application/xml');
          response.end(
            '<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult>' +
              '<Bucket>b</Bucket><Key>k</Key><UploadId>upload-1</UploadId>' +
              '</InitiateMultipartUploadResult>',
          );
        }
      });
      hanging.on('connection', (socket) => {
        sockets.add(socket);
        socket.on('close', () => sockets.delete(socket));
      });
      await new Promise<void>((resolve) => hanging.listen(0, '127.0.0.1', resolve));
      endpoint = `http://127.0.0.1:${(hanging.address() as AddressInfo).port}`;
    });

    beforeEach(() => {
      received = [];
    });

    afterAll(async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => hanging.close(resolve));
    });

    const connect = (options: Partial<S3PayloadStoreOptions> = {}) =>
      S3PayloadStore.connect({
        endpoint,
        region: 'us-east-1',
        forcePathStyle: true,
        bucket: BUCKET,
        credentials: CREDENTIALS,
        partBytes: 5 * MIB,
        client: { maxAttempts: 1 },
        ...options,
      });

    const uploadingParts = () => received.filter((request) => request.startsWith('PUT ?')).length;

    it("rejects a failed put with the source's error once abortTimeoutMs passed, and closes its requests", async () => {
      const store = connect({ abortTimeoutMs: 200 });
      const cause = new Error('camera disconnected');
      const source = generatedSource(12 * MIB, { failAfter: 6 * MIB, failWith: cause });

      const outcome = store.put(source.stream, putOptions).catch((error: unknown) => error);
      const settled = await Promise.race([outcome, delay(5_000).then(() => 'still waiting')]);

      expect(settled).toBe(cause);
      // The hung UploadPart and the AbortMultipartUpload were sent, and are closed, not left open.
      expect(uploadingParts()).toBe(1);
      expect(received).toContainEqual(expect.stringMatching(/^DELETE \?uploadId=upload-1&/));
      await eventually(() => sockets.size === 0, 'the requests to be closed', 2_000);
      await store.close();
    });

    it('rejects a put whose source is destroyed while a part waits on S3, with its error', async () => {
      const store = connect({ abortTimeoutMs: 200, partsInFlight: 1 });
      const source = generatedSource(40 * MIB);
      const outcome = store.put(source.stream, putOptions).catch((error: unknown) => error);
      await eventually(() => uploadingParts() === 1, 'the first UploadPart');

      // What publish() does with the caller's stream once its signal aborts.
      const reason = new Error('the publish was aborted');
      source.stream.destroy(reason);
      const settled = await Promise.race([outcome, delay(5_000).then(() => 'still waiting')]);

      expect(settled).toBe(reason);
      expect(uploadingParts()).toBe(1);
      await eventually(() => sockets.size === 0, 'the requests to be closed', 2_000);
      await store.close();
    });
  });

  describe('options', () => {
    it.each([
      ['a part under 5 MiB', { partBytes: 5 * MIB - 1 }, /partBytes/],
      ['a part over 5 GiB', { partBytes: 5 * 1024 * MIB + 1 }, /partBytes/],
      ['no parts in flight', { partsInFlight: 0 }, /partsInFlight/],
      ['a page over 1000 keys', { listPageSize: 1_001 }, /listPageSize/],
      ['an abort timeout of 0', { abortTimeoutMs: 0 }, /abortTimeoutMs/],
      ['a fractional abort timeout', { abortTimeoutMs: 1.5 }, /abortTimeoutMs/],
      ['a prefix that climbs', { prefix: '../' }, /prefix/],
      ['a prefix from the root', { prefix: '/payloads/' }, /prefix/],
      ['a prefix with a dot segment', { prefix: 'a/./' }, /prefix/],
      ['a prefix without a trailing /', { prefix: 'nseq' }, /prefix/],
      ['an empty bucket name', { bucket: '' }, /bucket/],
    ])('refuses %s with SequenceOptionsError', (_label, overrides, mentions) => {
      const make = () =>
        new S3PayloadStore(new S3Client({ region: 'us-east-1' }), {
          bucket: BUCKET,
          ...overrides,
        });

      expect(make).toThrow(SequenceOptionsError);
      expect(make).toThrow(mentions);
    });

    it('lists every problem at once', () => {
      const error = (() => {
        try {
          S3PayloadStore.connect({ bucket: '', partBytes: 1, prefix: '..' });
        } catch (caught) {
          return caught;
        }
      })();

      expect(error).toBeInstanceOf(SequenceOptionsError);
      expect((error as SequenceOptionsError).problems).toHaveLength(3);
    });
  });
});
