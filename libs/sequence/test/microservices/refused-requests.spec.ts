import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport, type InboundMessage } from 'nest-sequence';
import { deadLetters, deathReasonOf, eventually } from '../support/sequence-test-app';
import { useFaultyStoreApp } from './faulty-store-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

let calls = 0;

@Controller()
class Sizes {
  @MessagePattern('refused.size')
  size(@Payload() data: { text: string }): number {
    calls++;
    return data.text.length;
  }

  @MessagePattern('refused.small')
  small(@Payload() data: { text: string }): number {
    calls++;
    return data.text.length;
  }

  @MessagePattern('refused.ordered')
  ordered(): string {
    calls++;
    return 'in order';
  }

  @EventPattern('refused.events')
  event(): void {
    calls++;
  }
}

/**
 * A request refused before any handler takes it (its payload cannot be had, its sequence is
 * refused) is answered with the reason as it is dead-lettered: its caller does not wait for its
 * replyTimeoutMs. One answer per request, however many of its fragments are refused.
 */
describe('microservices: a request refused before its handler', () => {
  const fx = useFaultyStoreApp('ms-refused-', ({ transport, store }) => ({
    sequence: {
      transport,
      sequence: { fragmentBytes: 1024 },
      claimCheck: { store, inlineMaxBytes: 1024, sequenceMaxBytes: 32 * 1024 },
      handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
      tuning: { backpressureDelayMs: 10, maxStoreRequeues: 2 },
    },
    controllers: [Sizes],
    server: {
      channels: {
        'refused.small': { sequence: { maxSequenceBytes: 4 * 1024 } },
        'refused.events': { sequence: { maxSequenceBytes: 4 * 1024 } },
        'refused.ordered': { resequence: { gap: { timeoutMs: 60_000, policy: 'alert' } } },
      },
    },
    // Long enough that an error within the test's own timeout can only be the answer.
    client: { replyTimeoutMs: 20_000 },
  }));
  const { inner, transport } = fx;

  beforeEach(() => {
    transport.replies = 0;
    calls = 0;
    fx.store.failGets = 0;
  });

  const ask = (pattern: string, data: unknown) => lastValueFrom(fx.app.client.send(pattern, data));

  it('answers a claim-checked request whose payload the store never gives back with store-unavailable', async () => {
    fx.store.failGets = 1_000;
    const answer = await ask('refused.size', { text: 'x'.repeat(40 * 1024) }).catch(
      (error: unknown) => error,
    );
    expect(answer).toMatchObject({ status: 'error' });
    expect((answer as { message: string }).message).toMatch(/^store-unavailable: /);
    await inner.whenIdle();
    expect(calls).toBe(0);
    expect(transport.replies).toBe(1);
    expect(inner.actionsOn('refused.size')).toEqual(['requeue', 'requeue', 'dead-letter']);
    expect(deathReasonOf(deadLetters(inner, 'refused.size')[0])).toMatch(/^store-unavailable: /);
  });

  it('answers a request sent as a sequence the consumer refuses once, with the reason', async () => {
    const answer = await ask('refused.small', { text: 'y'.repeat(8 * 1024) }).catch(
      (error: unknown) => error,
    );
    expect(answer).toMatchObject({ status: 'error' });
    expect((answer as { message: string }).message).toMatch(/^sequence-too-large: /);
    await inner.whenIdle();
    // Every fragment is dead-lettered; the caller is answered once.
    expect(deadLetters(inner, 'refused.small').length).toBeGreaterThan(1);
    expect(calls).toBe(0);
    expect(transport.replies).toBe(1);
  });

  it('answers a request to a resequenced channel sent without its key, inline or as fragments', async () => {
    for (const text of ['short', 'v'.repeat(8 * 1024)]) {
      const answer = await ask('refused.ordered', { text }).catch((error: unknown) => error);
      expect(answer).toMatchObject({ status: 'error' });
      expect((answer as { message: string }).message).toMatch(/^invalid-resequence-event: /);
    }
    await inner.whenIdle();
    expect(calls).toBe(0);
    expect(transport.replies).toBe(2);
  });

  it('answers nothing for an event refused the same way', async () => {
    await lastValueFrom(fx.app.client.emit('refused.events', { text: 'z'.repeat(8 * 1024) }));
    await eventually(
      () => deadLetters(inner, 'refused.events').length > 1,
      'the fragments dead-lettered',
    );
    await inner.whenIdle();
    expect(calls).toBe(0);
    expect(transport.replies).toBe(0);
  });

  it('still answers a request that reaches its handler once, with its result', async () => {
    await expect(ask('refused.size', { text: 'w'.repeat(40 * 1024) })).resolves.toBe(40 * 1024);
    await inner.whenIdle();
    expect(calls).toBe(1);
    expect(transport.replies).toBe(1);
  });
});

/**
 * Correlation ids are each requester's own (a producer of another language may number its
 * requests 1, 2, 3...): requests of two requesters that share one are two requests.
 */
describe('microservices: requests of two requesters under one correlation id', () => {
  const transport = new InMemoryTransport();
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({ sequence: { transport }, controllers: [Sizes] });
  });
  afterAll(() => t?.close());

  /** A requester's reply channel, opened on the transport, and the replies it received. */
  const requester = async () => {
    const replies: InboundMessage[] = [];
    const { channel } = await transport.openReplyChannel(async (reply) => {
      replies.push(reply);
      return { action: 'ack' };
    });
    const ask = (correlationId: string, body: Buffer, headers: Record<string, string | number>) =>
      transport.publish('refused.size', body, {
        ...headers,
        'x-reply-to': channel,
        'x-correlation-id': correlationId,
      });
    return { replies, ask };
  };

  it('answers a refused request whose correlation id another requester’s answered request had', async () => {
    const [a, b] = [await requester(), await requester()];
    await a.ask('1', Buffer.from(JSON.stringify({ text: 'abc' })), {
      'content-type': 'application/json',
    });
    await transport.whenIdle();
    // B's own request 1, dead-lettered as it is taken: its ticket is no ticket.
    await b.ask('1', Buffer.from('not a ticket'), { 'x-claim-check': 1 });
    await transport.whenIdle();

    expect(a.replies.map((reply) => reply.headers['x-correlation-id'])).toEqual(['1']);
    expect(b.replies.map((reply) => reply.headers['x-correlation-id'])).toEqual(['1']);
    expect(b.replies[0].headers['x-reply-status']).toBe('error');
    expect(JSON.parse(String(b.replies[0].body))).toMatchObject({
      message: expect.stringMatching(/^claim-ticket-invalid: /) as unknown,
    });
  });
});
