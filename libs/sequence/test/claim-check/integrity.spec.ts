import { createHash } from 'node:crypto';
import { open, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import {
  ClaimCheckIntegrityError,
  PayloadMetadataCorruptError,
  SequenceError,
  type ClaimedPayload,
} from 'nest-sequence';
import { type ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  fieldsOf,
  publishTicket,
  signedByApp,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check: the bytes a handler reads are checked against the SHA-256 and size the ticket was
 * signed with, as they stream. On a mismatch the stream errors before it hands over the last byte
 * the ticket promises (or at its end, when fewer come), `toBuffer()` rejects, the handler is not
 * retried (the bytes would not change), the message is dead-lettered `integrity-mismatch`, and
 * the payload is kept for inspection.
 */
describe('claim check: payload bytes that do not match the ticket', () => {
  const payload = bytes(20_000, 1);
  const otherSha256 = createHash('sha256').update('something else').digest('hex');
  let t: ClaimCheckTestApp;
  let genuine: ClaimTicket;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      module: { handlerRetry: { attempts: 3, baseDelayMs: 1 } },
    });
    genuine = await t.claimCheck.checkIn(payload, { audience: t.channel });
  });
  afterEach(() => t.close());

  /** A validly signed ticket for the genuine payload, with a wrong digest or size. */
  const lyingTicket = (change: Partial<ClaimTicket>) =>
    signedByApp(t, { ...fieldsOf(genuine), ...change });

  async function expectDeadLetteredAsMismatch(): Promise<void> {
    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0].startsWith('integrity-mismatch: ')).toBe(true);
    expect(t.transport.actionsOn(t.channel)).not.toContain('requeue');
    expect(t.transport.depth(t.channel)).toBe(0);
    expect(t.transport.unsettled(t.channel)).toBe(0);
    expect(await claimMetric(t, 'integrity_failures_total', { channel: t.channel })).toBe(1);
    // Kept for inspection: retention deletes only what was handled successfully.
    expect(await t.store.head(genuine.ref)).toBeDefined();
  }

  it('stream(): errors with ClaimCheckIntegrityError before the last promised byte', async () => {
    const streamed: Buffer[] = [];
    t.handler.read = async (claimed: ClaimedPayload) => {
      for await (const chunk of claimed.stream()) streamed.push(chunk as Buffer);
      return Buffer.concat(streamed);
    };

    await publishTicket(t.transport, t.channel, lyingTicket({ sha256: otherSha256 }));
    await t.transport.whenIdle();

    const got = Buffer.concat(streamed);
    expect(got.length).toBeLessThan(payload.length);
    expect(got.equals(payload.subarray(0, got.length))).toBe(true);
    expect(t.handler.readErrors).toHaveLength(1);
    const error = t.handler.readErrors[0] as ClaimCheckIntegrityError;
    expect(error).toBeInstanceOf(ClaimCheckIntegrityError);
    expect(error).toBeInstanceOf(SequenceError);
    expect(error.code).toBe('integrity-mismatch');
    expect(error.expected).toEqual({ sha256: otherSha256, bytes: payload.length });
    expect(error.actual).toEqual({ sha256: genuine.sha256, bytes: payload.length });
    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries).toHaveLength(0);
    await expectDeadLetteredAsMismatch();
  });

  it('toBuffer(): rejects with ClaimCheckIntegrityError; the handler is not retried', async () => {
    await publishTicket(t.transport, t.channel, lyingTicket({ sha256: otherSha256 }));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.readErrors.map((e) => e instanceof ClaimCheckIntegrityError)).toEqual([true]);
    await expectDeadLetteredAsMismatch();
    expect(await claimMetric(t, 'handler_failures_total', { channel: t.channel })).toBe(1);
  });

  it('a wrong byte count with the true SHA-256: the same', async () => {
    await publishTicket(t.transport, t.channel, lyingTicket({ bytes: payload.length + 1 }));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    const [error] = t.handler.readErrors as ClaimCheckIntegrityError[];
    expect(error).toBeInstanceOf(ClaimCheckIntegrityError);
    expect(error.actual.bytes).toBe(payload.length);
    await expectDeadLetteredAsMismatch();
  });

  it('bytes altered in the store behind a genuine ticket: the same', async () => {
    const file = await open(join(t.root, ...genuine.ref.split('/')), 'r+');
    await file.write(Buffer.from([payload[12_345] ^ 0x01]), 0, 1, 12_345);
    await file.close();

    await publishTicket(t.transport, t.channel, genuine);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.readErrors[0]).toBeInstanceOf(ClaimCheckIntegrityError);
    await expectDeadLetteredAsMismatch();
  });

  describe('a reader that stops once it holds the declared bytes', () => {
    const large = bytes(1_000_000, 5);
    let altered: ClaimTicket;

    /** Reads until it holds `claimed.bytes` bytes, then stops: never asks for the stream's end. */
    async function readDeclaredLength(claimed: ClaimedPayload): Promise<Buffer> {
      const got: Buffer[] = [];
      let n = 0;
      for await (const chunk of claimed.stream()) {
        got.push(chunk as Buffer);
        n += (chunk as Buffer).length;
        if (n >= claimed.bytes) break;
      }
      return Buffer.concat(got);
    }

    beforeEach(async () => {
      altered = await t.claimCheck.checkIn(large, { audience: t.channel });
      // The same length, one byte flipped in the last chunk the store hands out.
      const file = await open(join(t.root, ...altered.ref.split('/')), 'r+');
      await file.write(Buffer.from([large[large.length - 10] ^ 0xff]), 0, 1, large.length - 10);
      await file.close();
    });

    it('@ClaimCheck: never gets the last bytes; dead-lettered, the payload kept', async () => {
      t.handler.read = readDeclaredLength;
      await publishTicket(t.transport, t.channel, altered);
      await t.transport.whenIdle();

      expect(t.handler.deliveries).toHaveLength(0);
      expect(t.handler.readErrors[0]).toBeInstanceOf(ClaimCheckIntegrityError);
      expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
      expect(deathReasons(t.transport, t.channel)[0]).toMatch(/^integrity-mismatch: /);
      expect(await t.store.head(altered.ref)).toBeDefined();
    });

    it('checkOut by hand: the read rejects, and integrityFailure says why', async () => {
      const claimed = await t.claimCheck.checkOut(altered);
      await expect(readDeclaredLength(claimed)).rejects.toBeInstanceOf(ClaimCheckIntegrityError);
      expect(claimed.integrityFailure).toBeInstanceOf(ClaimCheckIntegrityError);
    });

    it('gets every byte of a genuine payload', async () => {
      const claimed = await t.claimCheck.checkOut(
        await t.claimCheck.checkIn(large, { audience: t.channel }),
      );
      expect((await readDeclaredLength(claimed)).equals(large)).toBe(true);
      expect(claimed.integrityFailure).toBeUndefined();
    });
  });

  it('metadata the store cannot read (a corrupt sidecar): dead-lettered integrity-mismatch at once, not requeued as an outage', async () => {
    await writeFile(`${join(t.root, ...genuine.ref.split('/'))}.json`, '{"version":1,"bytes":');
    await expect(t.store.head(genuine.ref)).rejects.toBeInstanceOf(PayloadMetadataCorruptError);

    await publishTicket(t.transport, t.channel, genuine);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0]).toMatch(/^integrity-mismatch: .*metadata/);
    expect(t.transport.actionsOn(t.channel)).not.toContain('requeue');
  });

  it('a handler that swallows the stream error is still dead-lettered, not acked', async () => {
    t.handler.read = async (claimed) => {
      await claimed.toBuffer().catch(() => undefined);
      return Buffer.alloc(0);
    };
    await publishTicket(t.transport, t.channel, lyingTicket({ sha256: otherSha256 }));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
    await expectDeadLetteredAsMismatch();
  });

  it('the messages behind it are still delivered', async () => {
    const bystander = bytes(3_000, 2);
    await publishTicket(t.transport, t.channel, lyingTicket({ sha256: otherSha256 }));
    await publishTicket(
      t.transport,
      t.channel,
      await t.claimCheck.checkIn(bystander, { audience: t.channel }),
    );
    await t.transport.whenIdle();

    expect(t.handler.deliveries.map((d) => d.bytes.equals(bystander))).toEqual([true]);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter', 'ack']);
  });

  it('a handler whose own destination fails is a handler failure (retried, then handler-failed), not a store outage', async () => {
    // The documented pattern, pipeline(stream(), destination), into a destination that fails
    // (a full disk): pipeline destroys the payload's stream with the destination's error.
    const failures: unknown[] = [];
    t.handler.read = async (claimed: ClaimedPayload) => {
      const full = new Writable({
        write: (_chunk, _encoding, callback) => callback(new Error('ENOSPC: no space left')),
      });
      try {
        await pipeline(claimed.stream(), full);
      } catch (error) {
        failures.push(error);
        expect(claimed.readFailure).toBeUndefined();
        throw error;
      }
      return Buffer.alloc(0);
    };
    // Large enough to be read in many chunks: the read is under way when the destination fails.
    await publishTicket(
      t.transport,
      t.channel,
      await t.claimCheck.checkIn(bytes(2_000_000, 3), { audience: t.channel }),
    );
    await t.transport.whenIdle();

    // Before, the destination's error was taken for the store's: no retry, and the message was
    // requeued as "payload store unavailable", its payload read again each time.
    expect(failures).toHaveLength(3);
    expect(t.handler.calls).toBe(3);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toEqual([expect.stringMatching(/^handler-failed: .*ENOSPC/)]);
  });

  it('stops reading a payload larger than its ticket says as soon as it passes that size', async () => {
    // The store's bytes replaced by ten times as many (a store someone else can write to).
    const grown = Buffer.concat(Array.from({ length: 10 }, () => payload));
    const path = join(t.root, ...genuine.ref.split('/'));
    const file = await open(path, 'w');
    await file.write(grown);
    await file.close();
    const claimed = await t.claimCheck.checkOut(genuine);
    let read = 0;
    const reading = (async () => {
      for await (const chunk of claimed.stream()) read += (chunk as Buffer).length;
    })();
    await expect(reading).rejects.toBeInstanceOf(ClaimCheckIntegrityError);
    const error = claimed.integrityFailure!;
    expect(error.actual.bytes).toBeGreaterThan(payload.length);
    expect(error.actual.bytes).toBeLessThan(grown.length);
    // What the reader got never goes past the ticket's size.
    expect(read).toBeLessThanOrEqual(payload.length);
  });

  it('checkOut by hand: toBuffer rejects and integrityFailure tells why', async () => {
    const claimed = await t.claimCheck.checkOut(lyingTicket({ sha256: otherSha256 }));
    await expect(claimed.toBuffer()).rejects.toBeInstanceOf(ClaimCheckIntegrityError);
    expect(claimed.integrityFailure).toBeInstanceOf(ClaimCheckIntegrityError);
    // The genuine ticket reads the same bytes cleanly: the mismatch was the ticket's.
    const honest = await t.claimCheck.checkOut(genuine);
    expect((await honest.toBuffer()).equals(payload)).toBe(true);
    expect(honest.integrityFailure).toBeUndefined();
  });
});
