import { requeueCount, toDisposition, type Transport } from './transport.port';

describe('requeueCount', () => {
  it('reads a count as a number or decimal text, and anything else as none', () => {
    const count = (value: unknown) => requeueCount({ 'x-requeue-count': value });
    expect([count(3), count('4'), count(undefined), count(0), count(-2), count(1.5)]).toEqual([
      3, 4, 0, 0, 0, 0,
    ]);
    // What Number() throws on: an object without a usable toString (another program's header).
    expect(count({ toString: 1 })).toBe(0);
    expect(count(Object.create(null))).toBe(0);
  });
});

describe('toDisposition', () => {
  it.each<[unknown, unknown]>([
    [{ action: 'ack' }, { action: 'ack' }],
    [
      { action: 'dead-letter', reason: 'bad' },
      { action: 'dead-letter', reason: 'bad' },
    ],
    [{ action: 'dead-letter' }, { action: 'dead-letter', reason: 'dead-lettered by the handler' }],
    [
      { action: 'requeue', delayMs: 500 },
      { action: 'requeue', delayMs: 500 },
    ],
    [
      { action: 'requeue', reason: 'busy' },
      { action: 'requeue', delayMs: undefined, reason: 'busy' },
    ],
    [undefined, { action: 'requeue', delayMs: undefined }],
    [
      { action: 'whatever', delayMs: 500 },
      { action: 'requeue', delayMs: undefined },
    ],
  ])('reads %j as %j', (outcome, disposition) => {
    expect(toDisposition(outcome)).toEqual(disposition);
  });

  it.each<[number, number | undefined]>([
    [Number.NaN, undefined],
    [-5, 0],
    [Infinity, 2 ** 31 - 1],
    [2 ** 40, 2 ** 31 - 1],
  ])('keeps a requeue delay of %s within what a timer waits (%s)', (delayMs, expected) => {
    // Node fires a timer set beyond 2^31 - 1 ms (or NaN) after 1 ms: a busy requeue loop.
    expect(toDisposition({ action: 'requeue', delayMs })).toEqual({
      action: 'requeue',
      delayMs: expected,
    });
  });
});

describe('Transport', () => {
  it('is satisfied by a transport without openReplyChannel: reply channels are optional', async () => {
    const withoutReplies: Transport = {
      name: 'no-replies',
      maxMessageBytes: 1024,
      publish: async () => undefined,
      subscribe: async (channel) => ({ channel, close: async () => undefined }),
      deadLetterChannel: (channel) => `${channel}.dlq`,
      ping: async () => undefined,
      close: async () => undefined,
    };

    expect(withoutReplies.openReplyChannel).toBeUndefined();
    await expect(withoutReplies.ping()).resolves.toBeUndefined();
  });
});
