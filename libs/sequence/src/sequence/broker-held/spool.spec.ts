import {
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { crc32 } from '../../core/checksum';
import { StoredFragmentIntegrityError } from '../../core/errors/stored-fragment-integrity.error';
import { Spool } from './spool';

/** A slow disk: while set, a directory is made this many ms after it is asked for. */
const slowMkdir = { ms: 0 };
jest.mock('node:fs/promises', () => {
  const actual = jest.requireActual<typeof import('node:fs/promises')>('node:fs/promises');
  return {
    ...actual,
    mkdir: async (...args: Parameters<typeof actual.mkdir>) => {
      if (slowMkdir.ms > 0) await new Promise((resolve) => setTimeout(resolve, slowMkdir.ms));
      return actual.mkdir(...args);
    },
  };
});

describe('Spool: directories left by earlier processes', () => {
  let root: string;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'nseq-spool-'));
  });

  afterEach(() => {
    rmSync(root, { recursive: true, force: true });
  });

  /** A directory as a process of that PID leaves it when it is killed mid-sequence. */
  function leftBy(pid: number, suffix: string): string {
    const dir = join(root, `${pid}-${suffix}`);
    mkdirSync(dir);
    writeFileSync(join(dir, 'abandoned.spool'), Buffer.alloc(1024));
    return dir;
  }

  it("removes a directory with this process's PID that is not its own (a PID used again), and keeps a live process's", async () => {
    const samePid = leftBy(process.pid, 'deadbeef');
    // PID 1 (init, or a container's first process) is alive and not this process: its directory
    // may be in use, and stays.
    const live = leftBy(1, '0badcafe');
    const gone = leftBy(2 ** 22 + 7, 'feedf00d'); // above Linux's highest PID: nobody has it

    const spool = new Spool(root, 1024 * 1024);
    const file = await spool.create();

    expect({
      samePid: existsSync(samePid),
      live: existsSync(live),
      gone: existsSync(gone),
      own: existsSync(file.path),
    }).toEqual({ samePid: false, live: true, gone: false, own: true });
    await file.remove();
    await spool.close();
  });

  it("keeps what is not a spool's directory, even named after a PID nobody has", async () => {
    // A spool directory shared with other data: a volume with room, or the OS temp directory.
    const archive = join(root, `${2 ** 22 + 11}-studies`);
    mkdirSync(archive);
    writeFileSync(join(archive, 'study.dcm'), Buffer.alloc(1024));
    const report = join(root, `${2 ** 22 + 13}-0badf00d.csv`);
    writeFileSync(report, 'a,b\n');
    const numbered = join(root, `${2 ** 22 + 9}`);
    mkdirSync(numbered);
    const gone = leftBy(2 ** 22 + 7, 'feedf00d');

    const spool = new Spool(root, 1024 * 1024);
    const file = await spool.create();

    expect({
      archive: existsSync(join(archive, 'study.dcm')),
      report: existsSync(report),
      numbered: existsSync(numbered),
      gone: existsSync(gone),
    }).toEqual({ archive: true, report: true, numbered: true, gone: false });
    await file.remove();
    await spool.close();
  });

  it('makes its directory again when something removed it (a temp-directory cleaner)', async () => {
    const spool = new Spool(root, 1024 * 1024);
    const first = await spool.create();
    await first.remove();
    rmSync(dirname(first.path), { recursive: true, force: true });

    const next = await spool.create();
    await next.write(Buffer.from('spooled'), 0);
    expect(existsSync(next.path)).toBe(true);
    await next.remove();
    await spool.close();
  });

  it('keeps the directory of another spool of this process (another module or app)', async () => {
    const first = new Spool(root, 1024 * 1024);
    const held = await first.create();
    const second = new Spool(root, 1024 * 1024);
    const other = await second.create();

    const again = await first.create();
    expect(existsSync(held.path) && existsSync(other.path) && existsSync(again.path)).toBe(true);
    for (const file of [held, other, again]) await file.remove();
    await Promise.all([first.close(), second.close()]);
  });
});

describe('SpoolFile: reading back', () => {
  let root: string;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'nseq-spool-'));
  });

  afterEach(() => {
    rmSync(root, { recursive: true, force: true });
  });

  const bodies = [Buffer.alloc(3_000, 1), Buffer.alloc(2_000, 2), Buffer.alloc(1_500_000, 3)];
  const ranges = [
    { offset: 0, length: 3_000, position: 1, crc32: crc32(bodies[0]) },
    { offset: 3_000, length: 2_000, position: 2, crc32: crc32(bodies[1]) },
    { offset: 5_000, length: 1_500_000, position: 3, crc32: crc32(bodies[2]) },
  ];

  async function spooled(spool: Spool) {
    const file = await spool.create();
    for (const [index, body] of bodies.entries()) await file.write(body, ranges[index].offset);
    return file;
  }

  async function readAll(stream: NodeJS.ReadableStream) {
    const pieces: Buffer[] = [];
    let failure: unknown;
    try {
      for await (const piece of stream) pieces.push(piece as Buffer);
    } catch (error) {
      failure = error;
    }
    return { bytes: Buffer.concat(pieces), failure };
  }

  it('reads the bodies back as written, each checked against its CRC-32', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024);
    const file = await spooled(spool);
    const { bytes, failure } = await readAll(file.read(ranges, 's-1'));
    expect(failure).toBeUndefined();
    expect(bytes.equals(Buffer.concat(bodies))).toBe(true);
    await spool.close();
  });

  it('fails on a body changed on disk, before handing over any byte of it', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024);
    const file = await spooled(spool);
    const fd = openSync(file.path, 'r+');
    writeSync(fd, Buffer.from([9]), 0, 1, 3_000 + 1_999); // the last byte of position 2
    closeSync(fd);

    const { bytes, failure } = await readAll(file.read(ranges, 's-1'));
    expect(failure).toBeInstanceOf(StoredFragmentIntegrityError);
    expect(failure).toMatchObject({ sequenceId: 's-1', position: 2, from: 'spool' });
    expect((failure as Error).message).toMatch(/position 2 read back from the spool/);
    expect(bytes.equals(bodies[0])).toBe(true);
    await spool.close();
  });

  it('fails on a body of more than one piece changed on disk', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024);
    const file = await spooled(spool);
    const fd = openSync(file.path, 'r+');
    writeSync(fd, Buffer.from([9]), 0, 1, 5_000 + 10); // in the first MiB of position 3
    closeSync(fd);

    const { failure } = await readAll(file.read(ranges, 's-1'));
    expect(failure).toMatchObject({ position: 3, from: 'spool' });
    await spool.close();
  });
});

describe('SpoolFile: encrypted (a store that encrypts)', () => {
  let root: string;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'nseq-spool-'));
  });

  afterEach(() => {
    rmSync(root, { recursive: true, force: true });
  });

  // Offsets off the cipher's 16-byte blocks, a body over one read piece, written out of order.
  const bodies = [randomBytes(3_001), randomBytes(1_999), randomBytes(1_500_000)];
  const ranges = [
    { offset: 0, length: 3_001, position: 1, crc32: crc32(bodies[0]) },
    { offset: 3_001, length: 1_999, position: 2, crc32: crc32(bodies[1]) },
    { offset: 5_000, length: 1_500_000, position: 3, crc32: crc32(bodies[2]) },
  ];

  async function spooled(spool: Spool) {
    const file = await spool.create();
    for (const index of [2, 0, 1]) await file.write(bodies[index], ranges[index].offset);
    return file;
  }

  async function readAll(stream: NodeJS.ReadableStream) {
    const pieces: Buffer[] = [];
    for await (const piece of stream) pieces.push(piece as Buffer);
    return Buffer.concat(pieces);
  }

  it('keeps no body in clear on disk, and reads each back as it was given', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024, { encrypt: true });
    expect(spool.encrypts).toBe(true);
    const file = await spooled(spool);
    const onDisk = readFileSync(file.path);
    expect(onDisk.length).toBe(1_505_000);
    for (const body of bodies) expect(onDisk.includes(body.subarray(0, 64))).toBe(false);

    expect((await readAll(file.read(ranges, 's-1'))).equals(Buffer.concat(bodies))).toBe(true);
    // One body alone, from its own offset.
    expect((await readAll(file.read([ranges[1]], 's-1'))).equals(bodies[1])).toBe(true);
    await spool.close();
  });

  it('fails on a body changed on disk, as in clear', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024, { encrypt: true });
    const file = await spooled(spool);
    const fd = openSync(file.path, 'r+');
    writeSync(fd, Buffer.from([onDiskByte(file.path, 3_001 + 5) ^ 1]), 0, 1, 3_001 + 5);
    closeSync(fd);

    await expect(readAll(file.read(ranges, 's-1'))).rejects.toMatchObject({
      position: 2,
      from: 'spool',
    });
    await spool.close();
  });

  it('writes in clear without encrypt (a store that does not encrypt)', async () => {
    const spool = new Spool(root, 8 * 1024 * 1024);
    expect(spool.encrypts).toBe(false);
    const file = await spooled(spool);
    expect(readFileSync(file.path).subarray(3_001, 5_000).equals(bodies[1])).toBe(true);
    await spool.close();
  });
});

function onDiskByte(path: string, at: number): number {
  return readFileSync(path)[at];
}

describe('Spool: closing while it opens', () => {
  let root: string;

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'nseq-spool-'));
  });

  afterEach(() => {
    rmSync(root, { recursive: true, force: true });
  });

  afterEach(() => {
    slowMkdir.ms = 0;
  });

  it('leaves no directory behind when closed while it makes its directory again', async () => {
    const spool = new Spool(root, 1024 * 1024);
    const first = await spool.create();
    await first.remove();
    rmSync(dirname(first.path), { recursive: true, force: true }); // a temp-directory cleaner
    slowMkdir.ms = 50;

    const creating = spool.create().then(
      (file) => file.remove(),
      () => undefined,
    );
    await new Promise((resolve) => setTimeout(resolve, 20));
    await spool.close();
    await creating;
    expect(readdirSync(root)).toEqual([]);
  });
});

describe('Spool: who may read it', () => {
  let root: string;

  beforeEach(() => {
    root = join(mkdtempSync(join(tmpdir(), 'nseq-spool-')), 'spool');
  });

  afterEach(() => {
    rmSync(dirname(root), { recursive: true, force: true });
  });

  it("makes its directories and files readable by this process's user alone", async () => {
    const spool = new Spool(root, 1024 * 1024);
    const file = await spool.create();
    await file.write(Buffer.from('a patient record'), 0);

    const mode = (path: string) => statSync(path).mode & 0o777;
    expect({
      root: mode(root),
      directory: mode(dirname(file.path)),
      file: mode(file.path),
    }).toEqual({ root: 0o700, directory: 0o700, file: 0o600 });
    await file.remove();
    await spool.close();
  });

  // Only root can give the directory to another user; CI runs as root.
  (process.getuid?.() === 0 ? it : it.skip)(
    'refuses a shared root another user made first, writing nothing there',
    async () => {
      mkdirSync(root, { mode: 0o777 });
      chownSync(root, 65534, 65534); // nobody, as if they had made it before this process
      const spool = new Spool(root, 1024 * 1024, { sharedRoot: true });

      await expect(spool.create()).rejects.toThrow(/belongs to user 65534/);
      expect(readdirSync(root)).toEqual([]);
      await spool.close();
    },
  );
});
