import { bytes, makeFragments, publishAll } from '../support/sequence-test-app';
import { createClaimCheckTestApp, type ClaimCheckTestApp } from './claim-check-test-app';

const KiB = 1024;

/**
 * A @ClaimCheck channel's `sequence` limits apply to the payloads that arrive there as a Message
 * Sequence, each one in place of the module's: lowered or raised.
 */
describe('claim check: the sequence limits of a @ClaimCheck channel', () => {
  let t: ClaimCheckTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it("takes maxHeaderBytes from the channel's own sequence options, lowered or raised", async () => {
    t = await createClaimCheckTestApp({
      handlers: [
        { channel: 'cc.strict-headers', sequence: { maxHeaderBytes: 64 } },
        { channel: 'cc.wide-headers', sequence: { maxHeaderBytes: 32 * KiB } },
        { channel: 'cc.default-headers' },
      ],
      module: { sequence: { maxHeaderBytes: 16 * KiB } },
    });
    const payload = bytes(3_000, 7);
    const send = (channel: string, noteBytes: number) =>
      publishAll(
        t!.transport,
        channel,
        makeFragments(`${channel}-seq`, payload, 1_000, { 'x-note': 'n'.repeat(noteBytes) }),
      );
    await send('cc.strict-headers', 500);
    await send('cc.wide-headers', 20 * KiB);
    await send('cc.default-headers', 20 * KiB);
    await t.transport.whenIdle();

    const reasons = (channel: string) =>
      t!.transport.peek(`${channel}.dlq`).map((dead) => String(dead.headers['x-death-reason']));
    expect(t.handlerOn('cc.strict-headers').deliveries).toHaveLength(0);
    expect(reasons('cc.strict-headers')[0]).toMatch(/^headers-too-large: .*maxHeaderBytes \(64\)/);
    expect(t.handlerOn('cc.wide-headers').deliveries.map((d) => d.bytes.equals(payload))).toEqual([
      true,
    ]);
    expect(reasons('cc.wide-headers')).toEqual([]);
    expect(t.handlerOn('cc.default-headers').deliveries).toHaveLength(0);
    expect(reasons('cc.default-headers')[0]).toMatch(
      new RegExp(`^headers-too-large: .*maxHeaderBytes \\(${16 * KiB}\\)`),
    );
  });
});
