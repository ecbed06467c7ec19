import { randomBytes } from 'node:crypto';
import { open, readFile, truncate } from 'node:fs/promises';
import { join } from 'node:path';
import type { ClaimTicket } from 'nest-sequence/wire';
import { ENCRYPTION_OVERHEAD_BYTES } from '../../src/core/encryption-format';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check with `encryption.keys`: what lands in the store root is AES-256-GCM ciphertext;
 * handlers read the plaintext; a stored byte altered, or the payload cut short, is a final
 * integrity failure (dead-lettered `integrity-mismatch`, never retried or requeued).
 */
describe('claim check: encryption at rest', () => {
  const MARKER = 'PLAINTEXT-MARKER-';
  const plaintext = Buffer.from(MARKER.repeat(4_000));
  let t: ClaimCheckTestApp;
  let ticket: ClaimTicket;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      claimCheck: { encryption: { keys: [{ id: 'at-rest-1', key: randomBytes(32) }] } },
    });
    ticket = await t.claimCheck.checkIn(plaintext, {
      audience: t.channel,
      contentType: 'text/plain',
    });
  });
  afterEach(() => t.close());

  const dataFile = () => join(t.root, ...ticket.ref.split('/'));

  it('stores ciphertext only: no file under the root holds the plaintext', async () => {
    const files = await filesUnder(t.root);
    expect(files).toContain(ticket.ref);
    for (const file of files) {
      const content = await readFile(join(t.root, file));
      expect(content.includes(MARKER)).toBe(false);
    }
    expect((await readFile(dataFile())).length).toBe(plaintext.length + ENCRYPTION_OVERHEAD_BYTES);
  });

  it('the ticket and checkOut report the plaintext size; the raw store holds more', async () => {
    expect(ticket.bytes).toBe(plaintext.length);
    expect(await t.store.head(ticket.ref)).toMatchObject({
      bytes: plaintext.length + ENCRYPTION_OVERHEAD_BYTES, // the raw store sees ciphertext
    });
    const claimed = await t.claimCheck.checkOut(ticket);
    expect(claimed.bytes).toBe(plaintext.length);
  });

  it('hands the handler the plaintext', async () => {
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(plaintext)).toBe(true);
    expect(t.handler.deliveries[0].payload.contentType).toBe('text/plain');
  });

  it('publish() above the threshold round-trips through encryption', async () => {
    const big = randomBytes(300 * 1024);
    await t.claimCheck.publish(t.channel, big);
    await t.transport.whenIdle();
    expect(t.handler.deliveries[0].payload.via).toBe('ticket');
    expect(t.handler.deliveries[0].bytes.equals(big)).toBe(true);
  });

  async function expectIntegrityFailure(): Promise<void> {
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries).toHaveLength(0);
    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0].startsWith('integrity-mismatch: ')).toBe(true);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
    expect(await claimMetric(t, 'integrity_failures_total', { channel: t.channel })).toBe(1);
  }

  async function flipStoredByte(offset: number): Promise<void> {
    const file = await open(dataFile(), 'r+');
    const one = Buffer.alloc(1);
    await file.read(one, 0, 1, offset);
    one[0] ^= 0x01;
    await file.write(one, 0, 1, offset);
    await file.close();
  }

  it('a flipped ciphertext byte: dead-lettered integrity-mismatch', async () => {
    await flipStoredByte(ENCRYPTION_OVERHEAD_BYTES + 1_000);
    await expectIntegrityFailure();
    expect(t.handler.readErrors[0]).toMatchObject({ name: 'PayloadDecryptionError' });
  });

  it('a flipped authentication tag byte: dead-lettered integrity-mismatch', async () => {
    await flipStoredByte(plaintext.length + ENCRYPTION_OVERHEAD_BYTES - 1);
    await expectIntegrityFailure();
  });

  it('a flipped header byte: dead-lettered integrity-mismatch', async () => {
    await flipStoredByte(0);
    await expectIntegrityFailure();
  });

  it('the stored payload cut short: dead-lettered integrity-mismatch', async () => {
    await truncate(dataFile(), 200);
    await expectIntegrityFailure();
  });
});
