import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Spool } from './spool';

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
