import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { NATS_TRANSPORT_DEFAULTS, resolveNatsTransportOptions } from './nats.options';

describe('NatsTransport options', () => {
  it('fills in the defaults', () => {
    expect(resolveNatsTransportOptions()).toEqual(NATS_TRANSPORT_DEFAULTS);
    expect(resolveNatsTransportOptions({ ackWaitMs: undefined }).ackWaitMs).toBe(30_000);
  });

  it('lists every invalid option at once', () => {
    const resolve = () =>
      resolveNatsTransportOptions({
        ackWaitMs: 0,
        maxDeliver: 1,
        nakDelayMs: -1,
        streamPrefix: 'a.b',
        durableName: 'has space',
        prefetch: 0,
      });
    let error: unknown;
    try {
      resolve();
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect(error).toMatchObject({
      problems: [
        expect.stringMatching(/^ackWaitMs/),
        expect.stringMatching(/^nakDelayMs/),
        expect.stringMatching(/^maxDeliver/),
        expect.stringMatching(/^streamPrefix/),
        expect.stringMatching(/^durableName/),
        expect.stringMatching(/^prefetch/),
      ],
    });
  });

  it('refuses an unsafeSocketTricks that is not a boolean', () => {
    expect(() => resolveNatsTransportOptions({ unsafeSocketTricks: 'yes' as never })).toThrow(
      /unsafeSocketTricks must be true or false, got "yes"/,
    );
    expect(resolveNatsTransportOptions({ unsafeSocketTricks: true }).unsafeSocketTricks).toBe(true);
  });

  it('refuses a pullMaxBytes that is not a positive integer', () => {
    expect(() => resolveNatsTransportOptions({ pullMaxBytes: 0 })).toThrow(
      /pullMaxBytes must be a positive integer, got 0/,
    );
    expect(resolveNatsTransportOptions({ pullMaxBytes: 1 }).pullMaxBytes).toBe(1);
  });

  it('refuses a duplicate window no longer than the publish timeout', () => {
    expect(() =>
      resolveNatsTransportOptions({ publishTimeoutMs: 60_000, duplicateWindowMs: 60_000 }),
    ).toThrow(/duplicateWindowMs \(60000\) must exceed publishTimeoutMs/);
  });
});

describe('NatsTransport ackWaitMs', () => {
  it('refuses one shorter than 500 ms, which in-progress acks every 100 ms at most could not keep', () => {
    expect(() => resolveNatsTransportOptions({ ackWaitMs: 499 })).toThrow(
      /ackWaitMs must be an integer of milliseconds from 500 to \d+, got 499/,
    );
    expect(resolveNatsTransportOptions({ ackWaitMs: 500 }).ackWaitMs).toBe(500);
  });
});

describe('NatsTransport reply stream options', () => {
  it('refuses a reply max age no longer than the publish timeout: no reply could be sent', () => {
    // The reply stream's duplicate window is at most its max age, and a publish that may be
    // retried past its stream's window is refused.
    expect(() => resolveNatsTransportOptions({ replyMaxAgeMs: 5_000 })).toThrow(
      /replyMaxAgeMs \(5000\) must exceed publishTimeoutMs \(10000\)/,
    );
    expect(resolveNatsTransportOptions({ replyMaxAgeMs: 10_001 }).replyMaxAgeMs).toBe(10_001);
  });

  it('refuses reply stream limits that are not positive integers', () => {
    expect(() => resolveNatsTransportOptions({ replyMaxAgeMs: 0, replyMaxBytes: 1.5 })).toThrow(
      expect.objectContaining({
        problems: [
          expect.stringMatching(/^replyMaxAgeMs/),
          expect.stringMatching(/^replyMaxBytes/),
        ],
      }) as Error,
    );
  });
});

describe('NatsTransport partition options', () => {
  it.each([999, 1.5, 2 ** 31])('refuses a partitionLeaseMs of %p', (partitionLeaseMs) => {
    expect(() => resolveNatsTransportOptions({ partitionLeaseMs })).toThrow(
      expect.objectContaining({ problems: [expect.stringMatching(/^partitionLeaseMs/)] }) as Error,
    );
  });
});
