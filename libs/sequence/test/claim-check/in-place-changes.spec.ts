import { bytes } from '../support/sequence-test-app';
import { createClaimCheckTestApp, type ClaimCheckTestApp } from './claim-check-test-app';

/**
 * A handler may decode its payload in place and then fail: its retry must get the payload as it
 * was sent, not the bytes the failed call left.
 */
describe('claim check: a handler that changes its bytes in place, then fails', () => {
  let t: ClaimCheckTestApp;

  beforeEach(async () => {
    t = await createClaimCheckTestApp({ claimCheck: { inlineMaxBytes: 1_024 } });
  });

  afterEach(() => t.close());

  it('hands the retry of an inline payload the bytes as they were sent', async () => {
    const payload = bytes(512, 5);
    const seen: Buffer[] = [];
    t.handler.read = async (claimed) => {
      const chunks: Buffer[] = [];
      for await (const chunk of claimed.stream()) chunks.push(chunk as Buffer);
      seen.push(Buffer.concat(chunks));
      for (const chunk of chunks) chunk.fill(0x58); // decoded in place
      if (seen.length === 1) throw new Error('downstream unavailable');
      return Buffer.concat(chunks);
    };
    await t.claimCheck.publish(t.channel, payload);
    await t.transport.whenIdle();

    expect(seen).toHaveLength(2);
    expect(seen.map((read) => read.equals(payload))).toEqual([true, true]);
  });
});
