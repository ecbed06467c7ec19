import { MemorySequenceStore, AggregatorService } from 'nest-sequence';
import { parseFragmentHeaders } from 'nest-sequence/wire';
import { ExpirySweeper } from '../../src/sequence/expiry.sweeper';
import { bytes, makeFragments } from '../support/sequence-test-app';
import { createClaimCheckTestApp } from './claim-check-test-app';

/**
 * A @ClaimCheck channel's refusals go to its own dead-letter channel (`<channel>.dlq` unless the
 * handler names one), also when the module sets sequence.deadLetterChannel: the expiry record of
 * a sequence sent to the channel included.
 */
describe('claim check: the dead-letter channel of a sequence sent to a @ClaimCheck channel', () => {
  it("writes the expiry record to <channel>.dlq, not the module's sequence.deadLetterChannel", async () => {
    const channel = 'cc.expiring';
    const store = new MemorySequenceStore();
    const t = await createClaimCheckTestApp({
      handlers: [{ channel }],
      module: { sequence: { store, deadLetterChannel: 'sequences.dlq' } },
    });
    try {
      const of = t.app.get(AggregatorService).deadLetterChannelOf(channel);
      const [first] = makeFragments('half-sent', bytes(2_000, 3), 1_000);
      const now = Date.now();
      await store.accept(
        { ...parseFragmentHeaders(first.headers), scope: channel, body: first.body },
        {
          now,
          consumerId: 'another-instance',
          leaseMs: 30_000,
          expiry: { ms: 1_000, strategy: 'fixed' },
          limits: {
            maxSequenceBytes: 1 << 20,
            maxFragments: 10,
            maxBufferedBytes: 1 << 20,
            maxOpenSequences: 10,
          },
          retentionMs: 60_000,
        },
      );
      expect(await t.app.get(ExpirySweeper).sweep(now + 1_000)).toBe(1);
      const where = {
        deadLetterChannelOf: of,
        channelDlq: t.transport.peek(`${channel}.dlq`).length,
        sequencesDlq: t.transport.peek('sequences.dlq').length,
      };
      expect(where).toEqual({
        deadLetterChannelOf: `${channel}.dlq`,
        channelDlq: 1,
        sequencesDlq: 0,
      });
    } finally {
      await t.close();
      await store.close();
    }
  });
});
