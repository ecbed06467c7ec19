import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { Controller, Injectable, UseGuards, type CanActivate } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload, RpcException } from '@nestjs/microservices';
import { EMPTY, lastValueFrom, of } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { ClientClosedError, ReplyTimeoutError, SequenceRecord } from 'nest-sequence/microservices';
import { eventually } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

@Injectable()
class RefuseAll implements CanActivate {
  canActivate(): boolean {
    return false;
  }
}

let release: (() => void) | undefined;
let events = 0;
/** The sizes of the payloads rr.length was asked about. */
const lengths: number[] = [];

@Controller()
class Answers {
  @MessagePattern('rr.echo')
  echo(@Payload() data: unknown) {
    return { echoed: data };
  }

  @MessagePattern('rr.bytes')
  bytes(@Payload() request: { size: number; seed: number }) {
    return pseudoRandom(request.size, request.seed);
  }

  @MessagePattern('rr.length')
  length(@Payload() data: Buffer) {
    lengths.push(data.length);
    return data.length;
  }

  @MessagePattern('rr.many')
  many() {
    return of(1, 2, 3);
  }

  @MessagePattern('rr.none')
  none() {
    return EMPTY;
  }

  @MessagePattern('rr.failing')
  failing() {
    throw new RpcException('quote service down');
  }

  @MessagePattern('rr.guarded')
  @UseGuards(RefuseAll)
  guarded() {
    return 'never';
  }

  @EventPattern('rr.event')
  event() {
    events++;
  }

  @MessagePattern('rr.thrown-text')
  thrownText() {
    // eslint-disable-next-line @typescript-eslint/only-throw-error -- what some code throws
    throw 'quote service down';
  }

  @MessagePattern('rr.unreadable')
  unreadable() {
    // A file whose read fails part-way: the reply's upload to the payload store fails with it.
    let sent = false;
    return new Readable({
      read() {
        if (sent) return this.destroy(new Error('disk read failed'));
        sent = true;
        this.push(Buffer.alloc(64 * 1024, 1));
      },
    });
  }

  @MessagePattern('rr.slow')
  async slow() {
    await new Promise<void>((resolve) => (release = resolve));
    return 'late';
  }
}

function pseudoRandom(size: number, seed: number): Buffer {
  const bytes = Buffer.alloc(size);
  let x = seed;
  for (let i = 0; i < size; i++) {
    x = (x * 1103515245 + 12345) & 0x7fffffff;
    bytes[i] = x & 0xff;
  }
  return bytes;
}

const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

describe('request-reply: @MessagePattern and SequenceClient.send (embedded transport)', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 64 * 1024 },
        claimCheck: { inlineMaxBytes: 16 * 1024, sequenceMaxBytes: 1024 * 1024 },
      },
      controllers: [Answers],
      providers: [RefuseAll],
      client: { replyTimeoutMs: 2_000 },
    });
  });

  afterAll(async () => {
    release?.();
    await t?.close();
  });

  const ask = (pattern: string, data: unknown) => lastValueFrom(t.client.send(pattern, data));

  it('answers with the handler’s value', async () => {
    await expect(ask('rr.echo', { sku: 'A-1' })).resolves.toEqual({ echoed: { sku: 'A-1' } });
    // Typed as ClientProxy.send is: a reply read without a type given is Nest's default, any.
    const reply = await lastValueFrom(t.client.send('rr.echo', { sku: 'B-2' }));
    expect(reply.echoed.sku).toBe('B-2');
  });

  it('answers concurrent requests each with its own reply', async () => {
    const replies = await Promise.all(Array.from({ length: 20 }, (_, n) => ask('rr.echo', { n })));
    expect(replies).toEqual(Array.from({ length: 20 }, (_, n) => ({ echoed: { n } })));
  });

  it('sends a reply too large for one message as a Message Sequence', async () => {
    const reply = (await ask('rr.bytes', { size: 300 * 1024, seed: 7 })) as Buffer;
    expect(Buffer.isBuffer(reply)).toBe(true);
    expect(sha(reply)).toBe(sha(pseudoRandom(300 * 1024, 7)));
  });

  it('sends a reply larger than sequenceMaxBytes behind a claim ticket', async () => {
    const reply = (await ask('rr.bytes', { size: 2 * 1024 * 1024, seed: 9 })) as Buffer;
    expect(sha(reply)).toBe(sha(pseudoRandom(2 * 1024 * 1024, 9)));
  });

  it('refuses to send a stream again when its send() is subscribed to again', async () => {
    // As a retry() does: the stream was read by the first request, and what is left of it (here
    // nothing) must not go as the payload of a second.
    const asked = t.client.send('rr.length', Readable.from([Buffer.alloc(1_000, 1)]));
    await expect(lastValueFrom(asked)).resolves.toBe(1_000);
    await expect(lastValueFrom(asked)).rejects.toThrow(
      /rr\.length: its data is read as it is sent, and was sent already/,
    );
    await transport.whenIdle();
    expect(lengths).toEqual([1_000]);
  });

  it('sends JSON data again when its send() is subscribed to again', async () => {
    const asked = t.client.send('rr.echo', { records: null, total: 0 });
    await expect(lastValueFrom(asked)).resolves.toEqual({ echoed: { records: null, total: 0 } });
    await expect(lastValueFrom(asked)).resolves.toEqual({ echoed: { records: null, total: 0 } });
  });

  it('answers with the last value of an Observable', async () => {
    await expect(ask('rr.many', {})).resolves.toBe(3);
  });

  it('answers null for an Observable that completes without a value, as for no value', async () => {
    await expect(ask('rr.none', {})).resolves.toBeNull();
  });

  it('errors send() with the handler’s error, without a retry or a dead letter', async () => {
    await expect(ask('rr.failing', {})).rejects.toEqual({
      status: 'error',
      message: 'quote service down',
    });
    await transport.whenIdle();
    expect(transport.take(transport.deadLetterChannel('rr.failing'))).toHaveLength(0);
  });

  it('errors send() with a thrown text as it is', async () => {
    await expect(ask('rr.thrown-text', {})).rejects.toEqual({
      status: 'error',
      message: 'quote service down',
    });
  });

  it('errors send() when a guard refuses the request', async () => {
    await expect(ask('rr.guarded', {})).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^forbidden: /),
    });
  });

  it('errors send() at once for a pattern only @EventPattern handles, which still runs', async () => {
    await expect(ask('rr.event', {})).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^no-handler: .*no @MessagePattern/),
    });
    await transport.whenIdle();
    expect(events).toBe(1);
    expect(transport.take(transport.deadLetterChannel('rr.event'))).toHaveLength(0);
  });

  it('never answers an emit() that carries the reply headers of a request it forwards', async () => {
    // A @MessagePattern handler that passes its request on as an event, headers and all
    // (`ctx.getHeaders()`): its caller must get that handler's result, not a no-handler error.
    const answered: unknown[] = [];
    const replies = await transport.openReplyChannel(async (reply) => {
      answered.push(reply.headers);
      return { action: 'ack' };
    });
    try {
      const before = events;
      const forwarded = new SequenceRecord(
        { sku: 'A-1' },
        { headers: { 'x-reply-to': replies.channel, 'x-correlation-id': 'forwarded-1' } },
      );
      await lastValueFrom(t.client.emit('rr.event', forwarded));
      await transport.whenIdle();
      expect(events).toBe(before + 1);
      expect(answered).toEqual([]);
    } finally {
      await replies.close();
    }
  });

  it('errors send() at once, saying why, when the reply cannot be sent', async () => {
    const asked = Date.now();
    await expect(ask('rr.unreadable', {})).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^the reply could not be sent: .*disk read failed/),
    });
    expect(Date.now() - asked).toBeLessThan(1_000); // not at replyTimeoutMs (2 s)
  });

  it('sends the reply to a requester that is gone once, and no error reply after it', async () => {
    // A requester that stopped (its reply channel gone with it) leaves its requests behind; each
    // publish to its channel is refused for good, and retrying it only holds the request.
    const publish = jest.spyOn(transport, 'publish');
    try {
      release = undefined;
      const asked = ask('rr.slow', {}).catch((error: unknown) => error);
      await eventually(() => release !== undefined, 'the handler running');
      await t.client.close();
      expect(await asked).toBeInstanceOf(ClientClosedError);
      release!();
      await transport.whenIdle();
      const toReplyChannels = publish.mock.calls.filter(([channel]) =>
        transport.isReplyChannel(channel),
      );
      expect(toReplyChannels).toHaveLength(1);
    } finally {
      publish.mockRestore();
    }
  });

  it('errors send() with ReplyTimeoutError when no reply comes in time', async () => {
    await expect(ask('rr.slow', {})).rejects.toBeInstanceOf(ReplyTimeoutError);
    release?.();
  });
});
