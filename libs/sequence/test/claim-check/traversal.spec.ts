import { createHash, randomUUID } from 'node:crypto';
import { mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { InvalidPayloadRefError } from 'nest-sequence';
import { type ClaimTicket } from 'nest-sequence/wire';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  signedByApp,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check: a ref is untrusted input, even in a validly signed ticket (a leaked or misused
 * key, a buggy producer). Refs that climb out of the filesystem store's root, absolute paths,
 * and links planted inside it are refused as not found: the handler never runs, and nothing
 * outside the root is read or deleted.
 *
 * Each ticket names the SHA-256 and size of the secret file planted outside the root, so a
 * store that followed the path would pass the integrity check: only the store stands between
 * the ticket and the secret.
 */
describe('claim check: refs that try to leave the store root', () => {
  const SECRET = Buffer.from('TOP SECRET: outside the payload root\n');
  let t: ClaimCheckTestApp;
  /** `<dir>/secret.txt`, a sibling of the root `<dir>/root`. */
  let secretPath: string;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({ module: { handlerRetry: { attempts: 1 } } });
    secretPath = join(t.dir, 'secret.txt');
    await writeFile(secretPath, SECRET);
  });
  afterEach(() => t.close());

  /** A ticket this application signed, naming `ref` and the secret's digest. */
  function ticketFor(ref: string, content: Buffer = SECRET): ClaimTicket {
    return signedByApp(t, {
      store: 'filesystem',
      ref,
      bytes: content.length,
      sha256: createHash('sha256').update(content).digest('hex'),
      expiresAt: Date.now() + 60_000,
      audience: [t.channel],
    });
  }

  async function expectRefusedAsNotFound(ticket: ClaimTicket): Promise<void> {
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0].startsWith('claim-check-not-found: ')).toBe(true);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
    expect(t.handler.calls).toBe(0);
    expect(t.handler.deliveries.some((d) => d.bytes.includes(SECRET))).toBe(false);
    // Not deleted or changed either (retention deletes what a handled ticket names).
    expect((await readFile(secretPath)).equals(SECRET)).toBe(true);
  }

  describe('refs that climb out or are absolute', () => {
    it.each([
      ['../secret.txt'],
      ['../../etc/passwd'],
      ['/etc/passwd'],
      ['2030/01/01/../../../../secret.txt'],
      ['2030/01/01/00000000-0000-4000-8000-000000000000/../../../../../secret.txt'],
      ['..\\secret.txt'],
      ['./../secret.txt'],
    ])('%s: dead-lettered as not found, naming the refused ref', async (ref) => {
      await expectRefusedAsNotFound(ticketFor(ref));
      expect(deathReasons(t.transport, t.channel)[0]).toContain('refuses ref');
    });

    it('the absolute path of the planted secret: dead-lettered as not found', async () => {
      await expectRefusedAsNotFound(ticketFor(secretPath));
    });

    it('the real /etc/passwd, with its true digest: dead-lettered as not found', async () => {
      const passwd = await readFile('/etc/passwd');
      await expectRefusedAsNotFound(ticketFor('../../../../../../../../etc/passwd', passwd));
      await expect(t.claimCheck.checkOut(ticketFor('/etc/passwd', passwd))).rejects.toBeInstanceOf(
        InvalidPayloadRefError,
      );
    });
  });

  describe('links planted inside the root', () => {
    /** Writes a sidecar the store would accept for a payload of the secret's size. */
    async function plantSidecar(directory: string, id: string): Promise<void> {
      const now = Date.now();
      await writeFile(
        join(directory, `${id}.json`),
        JSON.stringify({
          version: 1,
          bytes: SECRET.length,
          createdAt: now,
          expiresAt: now + 60_000,
          published: true,
        }),
      );
    }

    it('(control) the same files planted as real files inside the root are delivered', async () => {
      // Shows that the refusals below come from the links, not from the planted sidecar.
      const id = randomUUID();
      const day = join(t.root, '2030', '01', '01');
      await mkdir(day, { recursive: true });
      await writeFile(join(day, id), SECRET);
      await plantSidecar(day, id);

      await publishTicket(t.transport, t.channel, ticketFor(`2030/01/01/${id}`));
      await t.transport.whenIdle();
      expect(t.handler.deliveries.map((d) => d.bytes.equals(SECRET))).toEqual([true]);
    });

    it('a payload file that is a link to the secret: dead-lettered as not found', async () => {
      const id = randomUUID();
      const day = join(t.root, '2030', '01', '01');
      await mkdir(day, { recursive: true });
      await symlink(secretPath, join(day, id));
      await plantSidecar(day, id);

      await expectRefusedAsNotFound(ticketFor(`2030/01/01/${id}`));
    });

    it('a day directory that is a link out of the root: dead-lettered as not found', async () => {
      const id = randomUUID();
      const outside = join(t.dir, 'outside', '01', '01');
      await mkdir(outside, { recursive: true });
      await writeFile(join(outside, id), SECRET);
      await plantSidecar(outside, id);
      await symlink(join(t.dir, 'outside'), join(t.root, '2031'));

      await expectRefusedAsNotFound(ticketFor(`2031/01/01/${id}`));
      expect((await readFile(join(outside, id))).equals(SECRET)).toBe(true);
    });
  });

  describe('by hand', () => {
    it('checkOut refuses a climbing ref with InvalidPayloadRefError', async () => {
      await expect(t.claimCheck.checkOut(ticketFor('../secret.txt'))).rejects.toBeInstanceOf(
        InvalidPayloadRefError,
      );
    });

    it('release refuses a climbing ref and deletes nothing outside the root', async () => {
      await expect(t.claimCheck.release(ticketFor('../secret.txt'))).rejects.toBeInstanceOf(
        InvalidPayloadRefError,
      );
      await expect(t.claimCheck.release(ticketFor(secretPath))).rejects.toBeInstanceOf(
        InvalidPayloadRefError,
      );
      expect((await readFile(secretPath)).equals(SECRET)).toBe(true);
    });
  });
});
