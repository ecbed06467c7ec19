import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import * as sidecarModule from './filesystem.payload-sidecar';
import {
  mkdir,
  mkdtemp,
  open,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  symlink,
  utimes,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { Readable } from 'node:stream';
import {
  describePayloadStoreConformance,
  digestOf,
  digestOfBuffer,
} from '../../../testing/conformance/payload-store.conformance';
import {
  ClaimCheckNotFoundError,
  InvalidPayloadRefError,
  PayloadMetadataCorruptError,
  SequenceOptionsError,
} from '../../../core/errors';
import type { PayloadStore, PutOptions } from '../../../ports/payload-store.port';
import * as layoutFiles from './filesystem.payload-layout';
import { FilesystemPayloadStore } from './filesystem.payload-store';
import type { FilesystemPayloadStoreOptions } from './filesystem.payload-store.options';

/** One directory per run; each store gets a root inside it, removed with it after the run. */
let workspace: string;

beforeAll(async () => {
  workspace = await mkdtemp(join(tmpdir(), 'nseq-fs-payloads-'));
});

afterAll(async () => {
  await rm(workspace, { recursive: true, force: true });
});

const freshRoot = () => join(workspace, randomUUID());

describePayloadStoreConformance('filesystem', {
  create: async () => new FilesystemPayloadStore({ root: freshRoot() }),
});

describePayloadStoreConformance('filesystem with fsync', {
  create: async () => new FilesystemPayloadStore({ root: freshRoot(), fsync: true }),
});

describePayloadStoreConformance('filesystem, as a store of your own without deleteUnpublished', {
  create: async () => {
    // Its own deleteUnpublished hidden: the suite must pass through the fallback alone.
    const bare = Object.create(new FilesystemPayloadStore({ root: freshRoot() })) as PayloadStore;
    Object.defineProperty(bare, 'deleteUnpublished', { value: undefined });
    return bare;
  },
});

const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';
const HOUR = 3_600_000;

/** Every file under `directory`, as paths relative to it. */
async function filesUnder(directory: string): Promise<string[]> {
  const entries = await readdir(directory, { recursive: true, withFileTypes: true }).catch(
    (error: NodeJS.ErrnoException) => (error.code === 'ENOENT' ? [] : Promise.reject(error)),
  );
  return entries
    .filter((entry) => !entry.isDirectory())
    .map((entry) => relative(directory, join(entry.parentPath, entry.name)))
    .sort();
}

async function eventually(condition: () => Promise<boolean>): Promise<void> {
  for (const deadline = Date.now() + 5_000; Date.now() < deadline;) {
    if (await condition()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('the condition did not hold within 5 s');
}

describe('FilesystemPayloadStore', () => {
  let root: string;
  let store: FilesystemPayloadStore;
  let t0: number;
  const options = (overrides: Partial<PutOptions> = {}): PutOptions => ({
    now: t0,
    expiresAt: t0 + HOUR,
    published: false,
    ...overrides,
  });
  const everything = () => ({ now: t0 + 1e12, unpublishedBefore: t0 + 1e12, limit: 1_000 });

  beforeEach(() => {
    root = freshRoot();
    store = new FilesystemPayloadStore({ root });
    t0 = Date.now();
  });

  it('is named filesystem', () => {
    expect(store.name).toBe('filesystem');
  });

  describe('its root', () => {
    it('is created, with its parents and private to the user, on first use', async () => {
      const nested = join(root, 'a', 'b');
      const lazy = new FilesystemPayloadStore({ root: nested });
      await expect(stat(root)).rejects.toMatchObject({ code: 'ENOENT' });

      await lazy.put(Buffer.from('first'), options());

      expect((await stat(nested)).mode & 0o777).toBe(0o700);
    });

    it('may be reached through a symbolic link configured as the root', async () => {
      await mkdir(root);
      const link = `${root}-link`;
      await symlink(root, link);
      const linked = new FilesystemPayloadStore({ root: link });

      const { ref } = await linked.put(Buffer.from('via link'), options());

      expect((await digestOf(await linked.get(ref))).bytes).toBe(8);
    });

    describe('by default, in a temporary directory others can write to', () => {
      let temporary: string;
      /** Where the default root is: `nest-sequence-payloads` in the temporary directory. */
      let planted: string;

      beforeEach(async () => {
        temporary = join(workspace, randomUUID());
        await mkdir(temporary);
        planted = join(temporary, 'nest-sequence-payloads');
      });

      /**
       * A store with the default root, under `temporary`. The default root is under
       * os.tmpdir(), read as the module loads; Jest's process.env is not the one node:os reads,
       * so the module is loaded with a tmpdir of the test's own. `whileResolving` runs once as
       * the store resolves its root, after node:fs/promises' realpath.
       */
      async function defaultRooted(whileResolving?: () => Promise<void>) {
        const fs = jest.requireActual<typeof import('node:fs/promises')>('node:fs/promises');
        let DefaultRooted!: typeof FilesystemPayloadStore;
        await jest.isolateModulesAsync(async () => {
          jest.doMock('node:os', () => ({
            ...jest.requireActual<typeof import('node:os')>('node:os'),
            tmpdir: () => temporary,
          }));
          let pending = whileResolving;
          jest.doMock('node:fs/promises', () => ({
            ...fs,
            realpath: async (path: string) => {
              const real = await fs.realpath(path);
              const once = pending;
              pending = undefined;
              await once?.();
              return real;
            },
          }));
          ({ FilesystemPayloadStore: DefaultRooted } = await import('./filesystem.payload-store'));
        });
        jest.dontMock('node:os');
        jest.dontMock('node:fs/promises');
        return new DefaultRooted();
      }

      /** Makes what this test creates count as another user's: this process is someone else. */
      const actAsAnotherUser = () => {
        const uid = process.getuid!();
        jest.spyOn(process, 'getuid').mockReturnValue(uid + 1);
        return uid;
      };

      afterEach(() => jest.restoreAllMocks());

      it('is refused when it is a symbolic link of another user, whatever it leads to', async () => {
        const target = join(workspace, randomUUID());
        await mkdir(target);
        await symlink(target, planted);
        const other = actAsAnotherUser();

        const store = await defaultRooted();

        await expect(store.put(Buffer.from('x'), options())).rejects.toThrow(
          `the filesystem payload store's default root ${planted} is a symbolic link of user ${other}`,
        );
        expect(await readdir(target)).toEqual([]);
      });
      it('is refused when its directory is swapped for a link while it is resolved', async () => {
        await mkdir(planted);
        const elsewhere = join(workspace, randomUUID());
        await mkdir(elsewhere);
        const store = await defaultRooted(async () => {
          // Another entry between the checks: here a link for a directory, or a directory of
          // their own for a link of another user.
          await rename(planted, `${planted}-moved`);
          await symlink(elsewhere, planted);
        });

        await expect(store.put(Buffer.from('x'), options())).rejects.toThrow(
          `the filesystem payload store's default root ${planted} was replaced while it was checked`,
        );
        expect(await readdir(elsewhere)).toEqual([]);
      });
    });

    it('makes ping reject when it cannot be created', async () => {
      await writeFile(root, 'a file where the root should be');

      await expect(store.ping()).rejects.toMatchObject({ code: 'EEXIST' });
    });
  });

  describe('its options', () => {
    it.each<[string, FilesystemPayloadStoreOptions, RegExp]>([
      // An empty root resolved to the working directory: payloads were written there.
      ['an empty root', { root: '' }, /root must be a directory path/],
      ['a root that is not a string', { root: 42 as never }, /root must be a directory path/],
      // 'false' from the environment is truthy: it turned fsync on.
      ['fsync as a string', { fsync: 'false' as never }, /fsync must be true or false/],
      // NaN kept every leftover forever; 0 or less removed the temporary files of puts under way.
      [
        'a NaN staleTemporaryMs',
        { staleTemporaryMs: NaN },
        /staleTemporaryMs must be an integer >= 1/,
      ],
      [
        'a zero staleTemporaryMs',
        { staleTemporaryMs: 0 },
        /staleTemporaryMs must be an integer >= 1/,
      ],
      [
        'a negative staleTemporaryMs',
        { staleTemporaryMs: -1 },
        /staleTemporaryMs must be an integer >= 1/,
      ],
      [
        'a staleTemporaryMs read from the environment',
        { staleTemporaryMs: '3600000' as never },
        /staleTemporaryMs must be an integer >= 1, got the string "3600000"/,
      ],
    ])('refuses %s with SequenceOptionsError', (_label, invalid, message) => {
      const build = () => new FilesystemPayloadStore(invalid);

      expect(build).toThrow(SequenceOptionsError);
      expect(build).toThrow(message);
    });

    it('lists every invalid option at once', () => {
      expect(
        () => new FilesystemPayloadStore({ root: '', fsync: 1 as never, staleTemporaryMs: 0.5 }),
      ).toThrow(/root[\s\S]*fsync[\s\S]*staleTemporaryMs/);
    });
  });

  describe('refs and files', () => {
    it('generates <yyyy>/<mm>/<dd>/<uuid> refs, the day being the UTC expiry day', async () => {
      const expiresAt = Date.UTC(2031, 1, 3, 23, 59, 59, 999);

      const { ref } = await store.put(Buffer.from('x'), options({ expiresAt }));

      expect(ref).toMatch(new RegExp(`^2031/02/03/${UUID}$`));
    });

    it('keeps the bytes, a sidecar and an unpublished marker, all private to the user', async () => {
      const payload = randomBytes(1_234);

      const { ref } = await store.put(payload, options({ contentType: 'image/png' }));

      expect(await filesUnder(root)).toEqual([ref, `${ref}.json`, `${ref}.unpublished`].sort());
      expect(await readFile(join(root, ref))).toEqual(payload);
      expect((await stat(join(root, ref))).mode & 0o777).toBe(0o600);
      expect((await stat(join(root, `${ref}.json`))).mode & 0o777).toBe(0o600);
    });

    it('rewrites the sidecar on markPublished and drops the marker, leaving no temporary file', async () => {
      const { ref } = await store.put(Buffer.from('x'), options());

      await store.markPublished(ref);

      expect(await filesUnder(root)).toEqual([ref, `${ref}.json`]);
      const sidecar = JSON.parse(await readFile(join(root, `${ref}.json`), 'utf8'));
      expect(sidecar).toMatchObject({ published: true });
    });

    it('refuses an expiry it cannot file, before writing anything', async () => {
      await expect(
        store.put(Buffer.from('x'), options({ expiresAt: Date.UTC(10_000, 0, 1) })),
      ).rejects.toBeInstanceOf(RangeError);

      expect(await filesUnder(root)).toEqual([]);
    });

    it('lets another store on the same root read what one stored', async () => {
      const payload = randomBytes(10_000);
      const { ref } = await store.put(payload, options());

      const other = new FilesystemPayloadStore({ root });

      expect(await digestOf(await other.get(ref))).toEqual(digestOfBuffer(payload));
    });
  });

  describe('writes', () => {
    it('streams into a temporary file that no reader sees until the source ended', async () => {
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      async function* source(): AsyncGenerator<Buffer> {
        yield randomBytes(256 * 1024);
        await gate;
        yield randomBytes(1_000);
      }
      const putting = store.put(Readable.from(source()), options());

      await eventually(async () => {
        const files = await filesUnder(root);
        const [only] = files;
        return files.length === 1 && (await stat(join(root, only))).size === 256 * 1024;
      });
      expect((await filesUnder(root))[0]).toMatch(/(^|\/)\.[^/]*\.tmp$/);
      expect(await store.sweepCandidates(everything())).toEqual([]);

      release();
      const { ref, bytes } = await putting;
      expect(bytes).toBe(256 * 1024 + 1_000);
      expect(await filesUnder(root)).toEqual([ref, `${ref}.json`, `${ref}.unpublished`].sort());
    });

    it('leaves no file behind when the source fails', async () => {
      async function* source(): AsyncGenerator<Buffer> {
        yield randomBytes(300_000);
        throw new Error('the upload was cut');
      }

      await expect(store.put(Readable.from(source()), options())).rejects.toThrow('was cut');

      expect(await filesUnder(root)).toEqual([]);
    });

    it('leaves no file behind when the source fails at once, however the file opening races it', async () => {
      // The failure outruns the temporary file's opening about once in a hundred puts.
      for (let put = 0; put < 500; put++) {
        // eslint-disable-next-line require-yield
        async function* source(): AsyncGenerator<Buffer> {
          throw new Error('the upload was cut');
        }
        await expect(store.put(Readable.from(source()), options())).rejects.toThrow('was cut');
      }

      expect(await filesUnder(root)).toEqual([]);
    });
  });

  describe('traversal', () => {
    let outside: string;
    const secret = 'outside the root';

    beforeEach(async () => {
      outside = join(workspace, `outside-${randomUUID()}`);
      await mkdir(join(outside, '01', '01'), { recursive: true });
      await writeFile(join(outside, 'secret'), secret);
      await store.ping();
    });

    it.each([
      ['climbing out of the root', () => relative(root, join(outside, 'secret'))],
      ['an absolute path', () => join(outside, 'secret')],
    ])('refuses %s, for reads and for deletes', async (_label, target) => {
      const ref = target();

      await expect(store.get(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      await expect(store.head(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      await expect(store.delete(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      expect(await readFile(join(outside, 'secret'), 'utf8')).toBe(secret);
    });

    it('does not read through a symbolic link planted as a payload file', async () => {
      const ref = `2030/01/01/${randomUUID()}`;
      await mkdir(join(root, '2030', '01', '01'), { recursive: true });
      await symlink(join(outside, 'secret'), join(root, ref));
      await symlink(join(outside, 'secret'), join(root, `${ref}.json`));

      await expect(store.get(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      await expect(store.head(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      await expect(store.markPublished(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
    });

    it.each([
      ['year', '2033'],
      ['month', join('2033', '01')],
    ])(
      'creates nothing outside when a put meets a %s directory linked out of it',
      async (_level, linked) => {
        const elsewhere = join(workspace, `elsewhere-${randomUUID()}`);
        await mkdir(elsewhere);
        await mkdir(join(root, linked, '..'), { recursive: true });
        await symlink(elsewhere, join(root, linked));

        await expect(
          store.put(Buffer.from('bytes'), options({ expiresAt: Date.UTC(2033, 0, 1, 12) })),
        ).rejects.toBeInstanceOf(InvalidPayloadRefError);
        expect(await readdir(elsewhere)).toEqual([]);
      },
    );

    describe('through a directory linked out of the root', () => {
      const id = randomUUID();
      const ref = `2032/01/01/${id}`;

      beforeEach(async () => {
        // A complete payload, but outside: the link is the only way the ref reaches it.
        await writeFile(join(outside, '01', '01', id), secret);
        const sidecar = { version: 1, bytes: 16, createdAt: 0, expiresAt: 0, published: false };
        await writeFile(join(outside, '01', '01', `${id}.json`), JSON.stringify(sidecar));
        await symlink(outside, join(root, '2032'));
      });

      it('refuses get, head and markPublished', async () => {
        await expect(store.get(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
        await expect(store.head(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
        await expect(store.markPublished(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);
      });

      it('refuses delete, and the file outside stays', async () => {
        await expect(store.delete(ref)).rejects.toBeInstanceOf(InvalidPayloadRefError);

        expect(await readFile(join(outside, '01', '01', id), 'utf8')).toBe(secret);
      });

      it('is not walked by sweeps', async () => {
        expect(await store.sweepCandidates(everything())).toEqual([]);
      });
    });
  });

  describe('sweepCandidates', () => {
    const dayOf = (ref: string) => join(root, ref, '..');
    /** A sweep for which nothing this block stores is due: it only walks (and tidies). */
    const nothingDue = () => ({ now: t0, unpublishedBefore: t0 - 1, limit: 100 });

    it('lists payloads of a day that ended as expired without reading their sidecars', async () => {
      const { ref } = await store.put(Buffer.from('x'), options({ published: true }));
      await writeFile(join(root, `${ref}.json`), 'not json');

      const candidates = await store.sweepCandidates({ ...everything(), now: t0 + 2 * 86_400_000 });

      expect(candidates).toEqual([{ ref, reason: 'expired' }]);
    });

    it('removes the directories of a day that ended once its payloads are gone, and keeps the others', async () => {
      const old = await store.put(Buffer.from('x'), options({ published: true }));
      const later = await store.put(Buffer.from('y'), {
        ...options({ published: true }),
        expiresAt: t0 + 400 * 86_400_000,
      });
      await store.delete(old.ref);

      expect(await store.sweepCandidates({ ...everything(), now: t0 + 2 * 86_400_000 })).toEqual(
        [],
      );
      // Before, every day directory ever used stayed, and every sweep listed it again.
      expect(existsSync(dayOf(old.ref))).toBe(false);
      expect(existsSync(dayOf(later.ref))).toBe(true);
      await expect(store.head(later.ref)).resolves.toBeDefined();
    });

    it('goes past a corrupt sidecar to the payloads after it', async () => {
      const broken = await store.put(Buffer.from('a'), options());
      const orphan = await store.put(Buffer.from('b'), options());
      await writeFile(join(root, `${broken.ref}.json`), '{"version":1}');

      const candidates = await store.sweepCandidates({
        now: t0,
        unpublishedBefore: t0,
        limit: 10,
      });

      expect(candidates).toEqual([{ ref: orphan.ref, reason: 'orphaned' }]);
    });

    it('removes temporary files and sidecars without bytes left by a crash, once stale', async () => {
      const { ref } = await store.put(Buffer.from('kept'), options({ published: true }));
      const day = dayOf(ref);
      const crashed = randomUUID();
      const leftovers = [`.${crashed}.1.tmp`, `${crashed}.json`, `${crashed}.unpublished`];
      for (const name of [...leftovers, '.fresh.2.tmp']) await writeFile(join(day, name), 'x');
      const twoHoursAgo = new Date(Date.now() - 2 * HOUR);
      for (const name of leftovers) await utimes(join(day, name), twoHoursAgo, twoHoursAgo);

      expect(await store.sweepCandidates(nothingDue())).toEqual([]);

      const id = ref.split('/')[3];
      expect((await readdir(day)).sort()).toEqual(['.fresh.2.tmp', id, `${id}.json`].sort());
    });

    it('drops a marker that outlived the sidecar it annotated', async () => {
      const { ref } = await store.put(Buffer.from('x'), options());
      await store.markPublished(ref);
      await writeFile(join(root, `${ref}.unpublished`), '');

      expect(await store.sweepCandidates(nothingDue())).toEqual([]);

      expect(await filesUnder(root)).toEqual([ref, `${ref}.json`]);
    });
  });

  describe('deleteUnpublished and markPublished', () => {
    /** What a sweep's deleteUnpublished does first: the payload's marker becomes its claim. */
    const claim = (ref: string) =>
      rename(join(root, `${ref}.unpublished`), join(root, `${ref}.deleting`));

    it("answers false to a markPublished that finds a sweep's claim, leaving that sweep an unpublished payload to delete", async () => {
      const { ref } = await store.put(Buffer.from('orphan'), options());
      await claim(ref);

      expect(await store.markPublished(ref)).toBe(false);

      // The sweep re-reads the sidecar next: published, it would keep a payload whose
      // markPublished answered false (and the publish would fail although the payload stayed).
      expect(await store.head(ref)).toMatchObject({ published: false });
    });

    it('keeps its claim and rejects when the sidecar cannot be read, deleting nothing', async () => {
      const { ref } = await store.put(Buffer.from('orphan'), options());
      await writeFile(join(root, `${ref}.json`), 'not json');

      await expect(store.deleteUnpublished(ref)).rejects.toBeInstanceOf(
        PayloadMetadataCorruptError,
      );

      // Renamed back, the marker would let a markPublished answer true while a sweep that found
      // the claim stale deletes the bytes.
      expect(await filesUnder(root)).toEqual([ref, `${ref}.deleting`, `${ref}.json`]);
    });

    describe('a claim left by a sweep that died', () => {
      beforeEach(() => {
        store = new FilesystemPayloadStore({ root, staleTemporaryMs: 1 });
      });

      /** Waits until the claim is older than staleTemporaryMs (1 ms). */
      const stale = () => new Promise((resolve) => setTimeout(resolve, 20));

      it('has its delete finished once stale, never becoming the marker again', async () => {
        const { ref } = await store.put(Buffer.from('orphan'), options());
        await claim(ref);
        await stale();

        expect(await store.sweepCandidates({ now: t0, unpublishedBefore: t0, limit: 10 })).toEqual(
          [],
        );

        expect(await filesUnder(root)).toEqual([]);
        expect(await store.markPublished(ref)).toBe(false);
      });

      it('is finished by a sweep while its claimant stalls, and markPublished does not answer true for the bytes it deletes', async () => {
        const { ref } = await store.put(Buffer.from('orphan'), options());
        let resume!: () => void;
        const stalled = new Promise<void>((resolve) => (resume = resolve));
        let readIt!: () => void;
        const read = new Promise<void>((resolve) => (readIt = resolve));
        const reader = store as unknown as { readSidecar(...args: unknown[]): Promise<unknown> };
        const readSidecar = reader.readSidecar.bind(store);
        // The claimant stalls between reading the sidecar (unpublished) and deleting the bytes.
        jest.spyOn(reader, 'readSidecar').mockImplementationOnce(async (...args) => {
          const sidecar = await readSidecar(...args);
          readIt();
          await stalled;
          return sidecar;
        });
        const deleting = store.deleteUnpublished(ref);
        // Should it reject before reading the sidecar, the test fails on it rather than waiting.
        await Promise.race([read, deleting]);
        await stale();

        // Before, this sweep gave the claim back as the marker, markPublished removed it and
        // answered true, and the claimant then deleted the bytes.
        await store.sweepCandidates({ now: t0, unpublishedBefore: t0, limit: 10 });
        const marked = await store.markPublished(ref);
        resume();
        const deleted = await deleting;

        expect({ marked, deleted, files: await filesUnder(root) }).toEqual({
          marked: false,
          deleted: false, // the sweep deleted it
          files: [],
        });
      });

      it('does not keep the sweep from the other payloads when it cannot be removed', async () => {
        const { ref } = await store.put(Buffer.from('orphan'), options());
        await claim(ref);
        const other = await store.put(Buffer.from('other'), options());
        await stale();
        // Its files cannot be removed (EACCES or EBUSY in the field; the tests may run as root).
        const refused = Object.assign(new Error('operation not permitted'), { code: 'EPERM' });
        const unlink = jest.spyOn(sidecarModule, 'unlinkIfPresent').mockRejectedValue(refused);
        try {
          expect(
            await store.sweepCandidates({ now: t0, unpublishedBefore: t0, limit: 10 }),
          ).toEqual(expect.arrayContaining([{ ref: other.ref, reason: 'orphaned' }]));
        } finally {
          unlink.mockRestore();
        }
      });

      it('is removed once stale when the payload is published', async () => {
        const { ref } = await store.put(Buffer.from('kept'), options({ published: true }));
        await writeFile(join(root, `${ref}.deleting`), '');
        await stale();

        expect(await store.sweepCandidates({ now: t0, unpublishedBefore: t0, limit: 10 })).toEqual(
          [],
        );

        expect(await filesUnder(root)).toEqual([ref, `${ref}.json`]);
        expect(await store.markPublished(ref)).toBe(true);
      });
    });
  });

  describe('a ref not held', () => {
    it('is not found when its day directory does not exist', async () => {
      const ref = `2040/05/06/${randomUUID()}`;

      await expect(store.get(ref)).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
      expect(await store.head(ref)).toBeUndefined();
      expect(await store.delete(ref)).toBe(false);
    });
  });

  describe('a sidecar whose metadata is not an object of strings', () => {
    it('answers head with PayloadMetadataCorruptError for a list, as Redis and S3 do', async () => {
      const { ref } = await store.put(Buffer.from('study'), options({ metadata: { a: '1' } }));
      const path = join(root, `${ref}.json`);
      const sidecar = JSON.parse(await readFile(path, 'utf8')) as Record<string, unknown>;
      await writeFile(path, JSON.stringify({ ...sidecar, metadata: ['1.2.840.113619'] }));

      await expect(store.head(ref)).rejects.toBeInstanceOf(PayloadMetadataCorruptError);
    });
  });

  describe('a reader while markPublished rewrites the metadata', () => {
    it('reads the payload, and never refuses its ref as a path that changed', async () => {
      const failures: unknown[] = [];
      for (let round = 0; round < 40; round++) {
        const { ref } = await store.put(Buffer.alloc(1_000, 1), options());
        let marked = false;
        const marking = store.markPublished(ref).finally(() => (marked = true));
        while (!marked) {
          await store.head(ref).catch((error: unknown) => failures.push(error));
        }
        await marking;
        expect(await store.head(ref)).toMatchObject({ published: true });
      }

      expect(failures).toEqual([]);
    });
  });
});

describe('FilesystemPayloadStore with fsync: what it syncs', () => {
  const options = (now: number): PutOptions => ({
    now,
    expiresAt: now + HOUR,
    published: false,
  });

  /** The directories synced while `work` runs. */
  async function directoriesSynced(work: () => Promise<unknown>): Promise<string[]> {
    const spy = jest.spyOn(layoutFiles, 'syncDirectory');
    try {
      await work();
      return spy.mock.calls.map(([directory]) => directory);
    } finally {
      spy.mockRestore();
    }
  }

  it('syncs every directory a put created, from the root down, so the new entries survive a power loss', async () => {
    const root = freshRoot();
    const store = new FilesystemPayloadStore({ root, fsync: true });
    let ref = '';
    const synced = await directoriesSynced(async () => {
      ({ ref } = await store.put(Buffer.from('study'), options(Date.now())));
    });
    const [year, month, day] = ref.split('/');

    expect(synced).toEqual(
      expect.arrayContaining([
        root,
        join(root, year),
        join(root, year, month),
        join(root, year, month, day),
      ]),
    );
  });

  it.each([true, false])(
    'syncs the payload bytes and the sidecar before they are renamed into place (fsync: %p)',
    async (fsync) => {
      const store = new FilesystemPayloadStore({ root: freshRoot(), fsync });
      const probe = await open(join(workspace, randomUUID()), 'wx');
      const fileHandle = Object.getPrototypeOf(probe) as { sync: () => Promise<void> };
      await probe.close();
      const sync = jest.spyOn(fileHandle, 'sync');
      try {
        const directories = await directoriesSynced(() =>
          store.put(Readable.from([Buffer.from('stu'), Buffer.from('dy')]), options(Date.now())),
        );
        // Each directory is synced through a handle of its own too.
        expect(sync.mock.calls.length - directories.length).toBe(fsync ? 2 : 0);
      } finally {
        sync.mockRestore();
      }
    },
  );

  it('syncs the directory after markPublished, so the published state and the gone marker last', async () => {
    const root = freshRoot();
    const store = new FilesystemPayloadStore({ root, fsync: true });
    const { ref } = await store.put(Buffer.from('study'), options(Date.now()));
    const [year, month, day] = ref.split('/');

    const synced = await directoriesSynced(() => store.markPublished(ref));

    expect(synced).toContain(join(root, year, month, day));
  });
});
