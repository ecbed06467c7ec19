import { Logger } from '@nestjs/common';
import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import { MessageTooLargeError } from '../../src/core/errors/message-too-large.error';
import { PublishRejectedError } from '../../src/core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../../src/core/errors/publish-timeout.error';
import type { ResequencerMetrics } from '../../src/resequencer/resequencer.metrics';
import type { PublishOptions, Transport } from '../../src/ports/transport.port';
import { AbandonedCalls } from '../../src/kernel/abandoned-calls';
import { HandOffDeliverer } from '../../src/resequencer/hand-off.deliverer';
import { Resequencer } from '../../src/resequencer/resequencer';
import { resolveResequencerDefinition } from '../../src/options/resolve-resequencer';
import { resolvedOptions } from './resequencer-parts';

const KEY = { scope: 'c', key: 'k' };

/** One publish the drainer made: to where, which event, with which options, and its confirm. */
interface Sent {
  readonly channel: string;
  readonly seq: number;
  readonly body: Buffer;
  readonly options?: PublishOptions;
  confirm(): void;
  fail(error: Error): void;
}

/**
 * A transport whose publishes wait until the test confirms or fails them (as a broker's confirms
 * do), recording each; `maxMessageBytes` small enough for the test's large body to be refused.
 */
function scriptedTransport() {
  const sent: Sent[] = [];
  const transport = {
    maxMessageBytes: 1_000,
    publish: (
      channel: string,
      body: Buffer,
      headers: Record<string, unknown>,
      options?: PublishOptions,
    ) => {
      if (body.length > 1_000) {
        return Promise.reject(new MessageTooLargeError(channel, body.length, 1_000));
      }
      return new Promise<void>((resolve, reject) =>
        sent.push({
          channel,
          seq: Number(headers['x-resequence-seq']),
          body,
          options,
          confirm: resolve,
          fail: reject,
        }),
      );
    },
  } as unknown as Transport;
  return { sent, transport };
}

async function accept(store: MemoryResequencerStore, seqs: number[], big: number[] = []) {
  for (const seq of seqs) {
    await store.accept(
      KEY,
      {
        seq,
        body: Buffer.alloc(big.includes(seq) ? 2_000 : 8, seq),
        headers: { 'x-resequence-seq': seq },
      },
      { start: 1, limits: { maxBufferedPerKey: 100, maxBufferedTotal: 100 }, now: Date.now() },
    );
  }
}

/**
 * What a resequencer publishing to `out` with `outputInFlight` is made of: its definition and
 * options, a quiet logger (warnings and errors recorded), and metrics that record only the
 * order-at-risk counts.
 */
function partsWith(outputInFlight: number) {
  const options = resolvedOptions({
    publish: { retry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 2 }, confirmTimeoutMs: 5_000 },
    tuning: { drain: { batchSize: 32 } },
  });
  const definition = resolveResequencerDefinition(
    'test',
    { channel: 'c', output: 'out', outputInFlight, gap: { timeoutMs: 60_000, policy: 'alert' } },
    options,
    (channel) => `${channel}.dlq`,
  );
  const logger = new Logger('test');
  const warn = jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
  const error = jest.spyOn(logger, 'error').mockImplementation(() => undefined);
  const atRisk: string[] = [];
  const metrics = new Proxy(
    {},
    {
      get: (_target, name) =>
        name === 'outputOrderAtRisk'
          ? (resequencer: string, count = 1) =>
              atRisk.push(...Array<string>(count).fill(resequencer))
          : () => undefined,
    },
  ) as ResequencerMetrics;
  return { definition, options, logger, metrics, warn, error, atRisk };
}

/** A resequencer publishing to `out` with `outputInFlight`, on a memory store. */
function resequencerWith(outputInFlight: number, transport: Transport) {
  const { definition, options, logger, metrics, ...recorded } = partsWith(outputInFlight);
  const store = new MemoryResequencerStore();
  const resequencer = new Resequencer(
    definition,
    { store, options, metrics, logger },
    { transport, reportGap: async () => undefined },
  );
  return { resequencer, store, ...recorded };
}

/** The deliverer alone, for a window asked of it directly, with what it logged. */
function delivererWith(outputInFlight: number, transport: Transport) {
  const { definition, options, logger, metrics, ...recorded } = partsWith(outputInFlight);
  const deliverer = new HandOffDeliverer({
    definition,
    transport,
    publish: options.publish,
    metrics,
    logger,
    reportGap: async () => undefined,
    abandoned: new AbandonedCalls(),
  });
  return { deliverer, ...recorded };
}

/** Hand-off items for the events `seqs`, as a claim brings them. */
function eventItems(seqs: number[]) {
  return seqs.map((seq) => ({
    kind: 'event' as const,
    entry: { seq, body: Buffer.from(`#${seq}`), headers: {} },
  }));
}

/**
 * Waits until the drainer has made `count` publishes in all, then a moment more, so that one it
 * should not have made would show.
 */
async function published(sent: readonly Sent[], count: number): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (sent.length < count && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  await new Promise((resolve) => setTimeout(resolve, 15));
}

describe('Resequencer output with outputInFlight above 1', () => {
  it("keeps up to outputInFlight of a key's publishes awaiting confirms, sent in order, none resent by the transport", async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store } = resequencerWith(4, transport);
    await accept(store, [1, 2, 3, 4, 5, 6]);

    const drained = resequencer.drain('k');
    await published(sent, 4);
    // Four out before any confirm, in order, each to be sent at most once.
    expect(sent.map((each) => each.seq)).toEqual([1, 2, 3, 4]);
    expect(sent.every((each) => each.channel === 'out' && each.options?.resend === false)).toBe(
      true,
    );
    for (const each of sent.slice(0, 4)) each.confirm();
    await published(sent, 6);
    expect(sent.map((each) => each.seq)).toEqual([1, 2, 3, 4, 5, 6]);
    for (const each of sent.slice(4)) each.confirm();

    await expect(drained).resolves.toBe('drained');
    await expect(store.inspect(KEY, 1)).resolves.toEqual({ next: 7, buffered: [], handOff: 0 });
  });

  it('with 1 (the default), waits for each confirm before the next publish', async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store } = resequencerWith(1, transport);
    await accept(store, [1, 2, 3]);

    const drained = resequencer.drain('k');
    for (const seq of [1, 2, 3]) {
      await published(sent, seq);
      expect(sent.map((each) => each.seq)).toEqual([1, 2, 3].slice(0, seq));
      sent[seq - 1].confirm();
    }
    await expect(drained).resolves.toBe('drained');
  });

  it('after a dropped connection fails part of a window, counts the confirmed events before it and sends the rest again, in order', async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store, warn, atRisk } = resequencerWith(4, transport);
    await accept(store, [1, 2, 3, 4, 5]);

    const drained = resequencer.drain('k');
    await published(sent, 4);
    sent[0].confirm();
    // A drop fails every publish still awaiting its confirm, in order, as the RabbitMQ transport
    // does with resend: false: each may have reached the broker, only its confirm is missing.
    for (const each of sent.slice(1, 4)) {
      each.fail(new PublishTimeoutError('out', 5_000, true, 'simulated: the channel closed'));
    }
    await published(sent, 8);
    expect(sent.map((each) => each.seq)).toEqual([1, 2, 3, 4, 2, 3, 4, 5]);
    for (const each of sent.slice(4)) each.confirm();

    await expect(drained).resolves.toBe('drained');
    await expect(store.inspect(KEY, 1)).resolves.toEqual({ next: 6, buffered: [], handOff: 0 });
    expect(warn).toHaveBeenCalledWith(expect.stringContaining('event 2 to out was not confirmed'));
    expect(atRisk).toEqual([]);
  });

  it.each([
    [
      'refused by the broker, a later one confirmed',
      () => new PublishRejectedError('out', new Error('nack')),
      (later: Sent) => later.confirm(),
    ],
    [
      'refused by the broker, a later one possibly on the output (its confirm timed out)',
      () => new PublishRejectedError('out', new Error('nack')),
      (later: Sent) => later.fail(new PublishTimeoutError('out', 5_000, true)),
    ],
    [
      'given up before it was handed over, a later one possibly on the output',
      () => new PublishTimeoutError('out', 5_000, false),
      (later: Sent) => later.fail(new PublishTimeoutError('out', 5_000, true)),
    ],
  ])(
    'reports an event that may have been overtaken (metric, error), then sends it again: %s',
    async (_case, failure, settleLater) => {
      const { sent, transport } = scriptedTransport();
      const { resequencer, store, error, atRisk } = resequencerWith(3, transport);
      await accept(store, [1, 2, 3]);

      const drained = resequencer.drain('k');
      await published(sent, 3);
      sent[0].confirm();
      const reason = failure();
      sent[1].fail(reason);
      settleLater(sent[2]);
      await published(sent, 5);
      // The failed event goes again, and with it those after it (3 may reach the output twice).
      expect(sent.map((each) => each.seq)).toEqual([1, 2, 3, 2, 3]);
      for (const each of sent.slice(3)) each.confirm();

      await expect(drained).resolves.toBe('drained');
      expect(atRisk).toEqual(['c']);
      expect(error).toHaveBeenCalledWith(
        expect.stringMatching(
          /key k: event\(s\) 2 to out failed while later ones sent with them were confirmed or may have reached the broker/,
        ),
      );
      expect(error).toHaveBeenCalledWith(expect.stringContaining(reason.message));
    },
  );

  it('when the first publish of a window fails, sends that event alone with the retries, and stops the drain if it cannot go', async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store } = resequencerWith(4, transport);
    await accept(store, [1, 2, 3]);

    const drained = resequencer.drain('k');
    await published(sent, 3);
    for (const each of sent.slice(0, 3)) each.fail(new Error('simulated: no broker'));
    // Then event 1 alone, three attempts (the retry policy), each failing.
    for (let attempt = 0; attempt < 3; attempt++) {
      await published(sent, 4 + attempt);
      expect(sent.map((each) => each.seq)).toEqual([1, 2, 3, ...Array(attempt + 1).fill(1)]);
      expect(sent[3 + attempt].options?.resend).not.toBe(false);
      sent[3 + attempt].fail(new Error('simulated: no broker'));
    }

    await expect(drained).resolves.toBe('failed');
    // Nothing was confirmed: all three wait at the head of the hand-off list.
    await expect(store.inspect(KEY, 1)).resolves.toMatchObject({
      next: 4,
      buffered: [],
      handOff: 3,
    });
  });

  it('ends a window before an event the transport could never send, which is dead-lettered alone; the key moves on', async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store } = resequencerWith(8, transport);
    await accept(store, [1, 2, 3, 4, 5], [3]);

    const drained = resequencer.drain('k');
    await published(sent, 2);
    expect(sent.map((each) => each.seq)).toEqual([1, 2]);
    sent[0].confirm();
    sent[1].confirm();
    await published(sent, 3);
    // Event 3 is too large for output: alone, refused before sending, it goes to the dead letters.
    expect(sent.map((each) => `${each.channel}:${each.seq}`)).toEqual([
      'out:1',
      'out:2',
      'c.dlq:3',
    ]);
    // Too large for the dead-letter channel too: a record of it without its body goes instead.
    expect(JSON.parse(sent[2].body.toString())).toMatchObject({
      kind: 'resequencer-output-unsendable',
      key: 'k',
      seq: 3,
      bytes: 2_000,
      bodyOmitted: true,
    });
    sent[2].confirm();
    await published(sent, 5);
    expect(sent.slice(3).map((each) => `${each.channel}:${each.seq}`)).toEqual(['out:4', 'out:5']);
    for (const each of sent.slice(3)) each.confirm();

    await expect(drained).resolves.toBe('drained');
    await expect(store.inspect(KEY, 1)).resolves.toEqual({ next: 6, buffered: [], handOff: 0 });
  });

  it('counts every publish that failed while a later one of its key was confirmed, and names them', async () => {
    const { sent, transport } = scriptedTransport();
    const { resequencer, store, error, atRisk } = resequencerWith(5, transport);
    await accept(store, [1, 2, 3, 4, 5]);

    const drained = resequencer.drain('k');
    await published(sent, 5);
    sent[0].confirm();
    sent[1].fail(new PublishRejectedError('out', new Error('nack')));
    sent[2].confirm();
    sent[3].fail(new Error('simulated: no confirm in time'));
    sent[4].confirm();
    await published(sent, 9);
    expect(sent.slice(5).map((each) => each.seq)).toEqual([2, 3, 4, 5]);
    for (const each of sent.slice(5)) each.confirm();

    await expect(drained).resolves.toBe('drained');
    expect(atRisk).toEqual(['c', 'c']);
    expect(error).toHaveBeenCalledTimes(1);
    expect(error).toHaveBeenCalledWith(
      expect.stringMatching(/key k: event\(s\) 2, 4 to out failed/),
    );
  });

  it('treats a transport that throws instead of rejecting as one failed publish of the window, the others still awaited', async () => {
    const { sent, transport } = scriptedTransport();
    const publish = transport.publish.bind(transport);
    transport.publish = (channel, body, headers, options) => {
      if (headers['x-resequence-seq'] === 3) throw new Error('simulated: thrown, not rejected');
      return publish(channel, body, headers, options);
    };
    const unhandled = jest.fn();
    process.on('unhandledRejection', unhandled);
    try {
      const { deliverer } = delivererWith(4, transport);
      const items = eventItems([1, 2, 3, 4]);
      const delivering = deliverer.deliverFrom('k', items, 0);
      await published(sent, 3);
      expect(sent.map((each) => each.seq)).toEqual([1, 2, 4]);
      sent[0].confirm();
      sent[1].fail(new Error('simulated: channel closed'));
      sent[2].confirm();

      // Event 1 counts; the drain goes on from event 2.
      await expect(delivering).resolves.toBe(1);
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled).not.toHaveBeenCalled();
    } finally {
      process.off('unhandledRejection', unhandled);
    }
  });

  it('makes no publish of a window the drain lease leaves no time for', async () => {
    const { sent, transport } = scriptedTransport();
    const { deliverer } = delivererWith(8, transport);
    const items = eventItems([1, 2, 3, 4]);
    let allowed = 2;
    const delivering = deliverer.deliverFrom('k', items, 0, { allows: () => allowed-- > 0 });
    await published(sent, 2);
    expect(sent.map((each) => each.seq)).toEqual([1, 2]);
    for (const each of sent) each.confirm();

    await expect(delivering).resolves.toBe(2);
  });

  it('says why it made no publish when the lease leaves no time for the first of a window', async () => {
    const { sent, transport } = scriptedTransport();
    const { deliverer, warn } = delivererWith(4, transport);
    const items = eventItems([1, 2]);

    await expect(deliverer.deliverFrom('k', items, 0, { allows: () => false })).resolves.toBe(0);
    expect(sent).toEqual([]);
    expect(warn).toHaveBeenCalledWith(
      expect.stringMatching(/key k: no publish of event 1 to out: .*drain lease/),
    );
  });
});
