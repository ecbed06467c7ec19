import { SequenceOptionsError, SplitterService } from 'nest-sequence';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  type SequenceTestApp,
} from '../support/sequence-test-app';

/**
 * The producer refuses, before sending, a fragmentBytes above the module's maxFragmentBytes:
 * its consumers would dead-letter every fragment. User headers above the module's maxHeaderBytes
 * are the same case (every fragment dead-lettered headers-too-large), refused the same way.
 */
describe('SplitterService: user headers over the module maxHeaderBytes', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('refuses them with a SequenceOptionsError rather than sending a sequence every consumer dead-letters', async () => {
    const channel = 'producer.headers.limit';
    t = await createSequenceTestApp(channel, { sequence: { maxHeaderBytes: 1_024 } });
    const splitter = t.app.get(SplitterService);

    const outcome = await splitter
      .send(channel, bytes(100), { sequenceId: 'tagged', headers: { note: 'x'.repeat(2_000) } })
      .then(
        () => 'sent',
        (error: unknown) => error,
      );
    await t.transport.whenIdle();

    const dead = deadLetters(t.transport, channel).map(deathReasonOf);
    expect({ outcome, dead }).toEqual({
      outcome: expect.any(SequenceOptionsError),
      dead: [],
    });
  });
});
