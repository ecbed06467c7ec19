import { Readable } from 'node:stream';
import { ClaimTicketInvalidError } from 'nest-sequence';
import { bytes, FaultInjectingTransport } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/** A stream of `payload` in `pieces` chunks, one every `gapMs`: a source slower than the store. */
function slowSource(payload: Buffer, pieces: number, gapMs: number): Readable {
  const size = Math.ceil(payload.length / pieces);
  return Readable.from(
    (async function* () {
      for (let offset = 0; offset < payload.length; offset += size) {
        await new Promise((resolve) => setTimeout(resolve, gapMs));
        yield payload.subarray(offset, offset + size);
      }
    })(),
  );
}

/**
 * Claim Check: a payload's ticket expires `ttlMs` after its upload began, and an unpublished
 * payload is an orphan `orphanGraceMs` after it. A payload whose upload takes long must neither
 * go out behind a ticket its consumers refuse, nor be swept while its ticket is being published.
 */
describe('claim check: a payload that takes long to store', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t.close());

  describe('past its ttlMs', () => {
    beforeEach(async () => {
      t = await createClaimCheckTestApp({ claimCheck: { inlineMaxBytes: 100 } });
    });

    it('publish() rejects with ClaimTicketInvalidError (expired), keeps nothing and publishes nothing', async () => {
      const error: unknown = await t.claimCheck
        .publish(t.channel, slowSource(bytes(1_000, 1), 4, 100), { ttlMs: 200 })
        .then(
          () => undefined,
          (rejection: unknown) => rejection,
        );
      await t.transport.whenIdle();

      expect(error).toBeInstanceOf(ClaimTicketInvalidError);
      expect((error as ClaimTicketInvalidError).reason).toBe('expired');
      expect(t.transport.settlements).toEqual([]);
      expect(deathReasons(t.transport, t.channel)).toEqual([]);
      expect(await filesUnder(t.root)).toEqual([]);
    });

    it('checkIn() rejects the same way rather than return a ticket no one can use', async () => {
      await expect(
        t.claimCheck.checkIn(slowSource(bytes(1_000, 2), 4, 100), {
          audience: t.channel,
          ttlMs: 200,
        }),
      ).rejects.toMatchObject({ name: 'ClaimTicketInvalidError', reason: 'expired' });
      expect(await filesUnder(t.root)).toEqual([]);
    });

    it('an upload within its ttlMs still goes through', async () => {
      const payload = bytes(1_000, 3);
      const receipt = await t.claimCheck.publish(t.channel, slowSource(payload, 4, 20), {
        ttlMs: 10_000,
      });
      await t.transport.whenIdle();

      expect(receipt.via).toBe('ticket');
      expect(t.handler.deliveries).toHaveLength(1);
      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    });
  });

  describe('past half its orphanGraceMs', () => {
    // orphanGraceMs must be above twice the publish budget: 1 × (100 + 10) ms.
    const ORPHAN_GRACE_MS = 300;
    let transport: FaultInjectingTransport;
    beforeEach(async () => {
      t = await createClaimCheckTestApp({
        claimCheck: { inlineMaxBytes: 100, orphanGraceMs: ORPHAN_GRACE_MS },
        module: {
          publish: {
            confirmTimeoutMs: 100,
            retry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 10 },
          },
        },
        wrapTransport: (inner) => (transport = new FaultInjectingTransport(inner)),
      });
    });

    it('is not swept as an orphan by a sweep that runs while its ticket is published', async () => {
      // The sweep of any instance, landing between the end of the upload and the confirm.
      transport.beforePublish = async ({ channel }) => {
        if (channel === t.channel) await t.sweeper.sweep(Date.now());
      };
      const payload = bytes(1_000, 4);

      const receipt = await t.claimCheck.publish(t.channel, slowSource(payload, 4, 100));
      await t.transport.whenIdle();

      expect(receipt.via).toBe('ticket');
      expect(deathReasons(t.transport, t.channel)).toEqual([]);
      expect(t.handler.deliveries).toHaveLength(1);
      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    });

    it('is still deleted when its ticket cannot be published', async () => {
      transport.beforePublish = () => {
        throw new Error('the broker refused the message (injected)');
      };

      await expect(
        t.claimCheck.publish(t.channel, slowSource(bytes(1_000, 5), 4, 100)),
      ).rejects.toMatchObject({ name: 'ClaimCheckPublishError' });
      expect(await filesUnder(t.root)).toEqual([]);
    });
  });
});
