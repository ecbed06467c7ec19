import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { Controller } from '@nestjs/common';
import { MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { FilesystemPayloadStore, MemorySequenceStore, type Transport } from 'nest-sequence';
import type { PayloadStore } from 'nest-sequence/ports';
import { namedTransport, useRabbitMq } from '../support/rabbitmq.fixture';
import { describeWithServer } from '../support/servers';
import { SettlementRecordingTransport } from '../claim-check/claim-check-test-app';
import { FaultInjectingPayloadStore } from '../claim-check/fault-injecting.payload-store';
import { overrideMethods } from '../support/override-methods';
import { CountedReplies } from './counted-replies.transport';
import { useFaultyStoreApp } from './faulty-store-app';
import {
  createMicroserviceTestApp,
  type MicroserviceTestApp,
  type MicroserviceTestAppOptions,
} from './microservice-test-app';

const TIMEOUT_MS = 50;

const ask = (app: MicroserviceTestApp, pattern: string, data: unknown) =>
  lastValueFrom(app.client.send(pattern, data));

let calls = 0;

@Controller()
class Measures {
  @MessagePattern('sr.size')
  size(@Payload() data: { text: string }): number {
    calls++;
    return data.text.length;
  }

  /** Reads its payload as a stream; a careless handler that hangs when the read fails. */
  @MessagePattern('sr.stream')
  async stream(@Payload() data: Readable): Promise<number> {
    calls++;
    let bytes = 0;
    try {
      for await (const chunk of data) bytes += (chunk as Buffer).length;
    } catch {
      await new Promise<void>(() => undefined); // never settles: runs past handlerTimeoutMs
    }
    return bytes;
  }

  /** Answers with a stream it opens (a file, say), whether its payload could be read or not. */
  @MessagePattern('sr.stream-reply')
  async streamReply(@Payload() data: Readable): Promise<Readable> {
    calls++;
    let bytes = 0;
    try {
      for await (const chunk of data) bytes += (chunk as Buffer).length;
    } catch {
      // answers with what it read
    }
    const reply = Readable.from([Buffer.from(String(bytes))]);
    replies.push(reply);
    return reply;
  }
}

/** The streams `sr.stream-reply` answered with. */
const replies: Readable[] = [];

/**
 * The app of both suites over `transport` and `store`: requests of over 1 KiB travel by ticket,
 * one handler call each, `sr.stream`'s handler limited to TIMEOUT_MS; `channelOf` maps the
 * patterns to channels on both sides.
 */
function measuresApp(
  transport: Transport,
  store: PayloadStore,
  replyTimeoutMs: number,
  channelOf?: (pattern: string) => string,
): MicroserviceTestAppOptions {
  const routing = channelOf ? { channelOf } : {};
  return {
    sequence: {
      transport,
      claimCheck: { store, inlineMaxBytes: 1024, sequenceMaxBytes: 2048 },
      handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
      tuning: { backpressureDelayMs: 10 },
    },
    controllers: [Measures],
    server: {
      ...routing,
      streamAboveBytes: 1024,
      channels: { [channelOf?.('sr.stream') ?? 'sr.stream']: { handlerTimeoutMs: TIMEOUT_MS } },
    },
    client: { ...routing, replyTimeoutMs },
  };
}

/**
 * A request whose payload the store fails to give back is requeued, not answered: the caller
 * gets one outcome, the answer of the delivery that read it.
 */
describe('microservices: a request whose payload cannot be read from the store', () => {
  const fx = useFaultyStoreApp('ms-store-reads-', ({ transport, store }) =>
    measuresApp(transport, store, 5_000),
  );
  const { inner, transport } = fx;

  beforeEach(() => {
    transport.replies = 0;
    calls = 0;
    inner.settlements.length = 0;
  });

  const ask = (pattern: string, data: unknown) => lastValueFrom(fx.app.client.send(pattern, data));

  it('answers once, with the result, when the first read of a claim-checked request fails', async () => {
    fx.store.failGets = 1;
    await expect(ask('sr.size', { text: 'x'.repeat(8 * 1024) })).resolves.toBe(8 * 1024);
    await inner.whenIdle();
    expect(calls).toBe(1); // the first delivery's payload never reached it
    expect(transport.replies).toBe(1);
    expect(inner.actionsOn('sr.size')).toEqual(['requeue', 'ack']);
  });

  it('destroys the stream a call that failed to read answers with, which is not sent', async () => {
    replies.length = 0;
    fx.store.failGets = 1;
    await expect(ask('sr.stream-reply', Buffer.alloc(8 * 1024, 6))).resolves.toEqual(
      Buffer.from('8192'),
    );
    await inner.whenIdle();
    expect(calls).toBe(2);
    expect(transport.replies).toBe(1);
    expect(replies.map((reply) => reply.destroyed)).toEqual([true, true]);
  });

  it('answers once, with the result, when a call that failed to read runs past its limit', async () => {
    fx.store.failGets = 1;
    await expect(ask('sr.stream', Buffer.alloc(8 * 1024, 4))).resolves.toBe(8 * 1024);
    await inner.whenIdle();
    expect(calls).toBe(2);
    expect(transport.replies).toBe(1);
    expect(inner.actionsOn('sr.stream')).toEqual(['requeue', 'ack']);
  });
});

describe('microservices: a request sent as a Message Sequence the store cannot read back', () => {
  const inner = new SettlementRecordingTransport();
  const transport = new CountedReplies(inner);
  const memory = new MemorySequenceStore();
  let failReads = 0;
  let reads = 0;
  const store = overrideMethods(memory, {
    read: (ref) => {
      reads++;
      if (failReads-- <= 0) return memory.read(ref);
      return new Readable({
        read() {
          this.destroy(new Error('sequence store unreachable (read, injected by the test)'));
        },
      });
    },
  });
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { store, fragmentBytes: 1024 },
        claimCheck: { inlineMaxBytes: 1024, sequenceMaxBytes: 64 * 1024 },
        handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
        tuning: { backpressureDelayMs: 10 },
      },
      controllers: [Measures],
      client: { replyTimeoutMs: 5_000 },
    });
  });
  afterAll(async () => {
    await t?.close();
    await inner.close();
  });

  it('answers once, with the result of the delivery that read it', async () => {
    calls = 0;
    failReads = 1;
    await expect(ask(t, 'sr.size', { text: 'z'.repeat(8 * 1024) })).resolves.toBe(8 * 1024);
    await inner.whenIdle();
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(reads).toBeGreaterThanOrEqual(2);
    expect(calls).toBe(1); // the first delivery's payload never reached it
    expect(transport.replies).toBe(1);
  });
});

/** The same over RabbitMQ, whose requeue (delayed) and reply queues are the broker's. */
describeWithServer('rabbitmq', 'microservices: an unreadable request payload on RabbitMQ', () => {
  const opened: Array<{ close(): Promise<unknown> }> = [];
  const broker = useRabbitMq({
    beforeCleanup: async () => {
      for (const each of opened.splice(0).reverse()) await each.close();
    },
  });
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ms-store-reads-rmq-'));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));
  beforeEach(() => (calls = 0));

  it('answers each request once, with the result of the delivery that read it', async () => {
    const channels: Record<string, string> = {
      'sr.size': broker.admin.newChannel(),
      'sr.stream': broker.admin.newChannel(),
    };
    const channelOf = (pattern: string) => channels[pattern] ?? pattern;
    const transport = new CountedReplies(await namedTransport(`ms-store-reads-${Date.now()}`));
    opened.push(transport);
    const store = new FaultInjectingPayloadStore(new FilesystemPayloadStore({ root: dir }));
    const t = await createMicroserviceTestApp(measuresApp(transport, store, 10_000, channelOf));
    opened.push(t);

    store.failGets = 1;
    await expect(
      lastValueFrom(t.client.send('sr.size', { text: 'y'.repeat(8 * 1024) })),
    ).resolves.toBe(8 * 1024);
    store.failGets = 1;
    await expect(
      lastValueFrom(t.client.send('sr.stream', Buffer.alloc(8 * 1024, 5))),
    ).resolves.toBe(8 * 1024);
    // Long enough for a second reply to come, had the requeued deliveries been answered too.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(store.calls.get).toBe(4); // each request read twice: the failed read, the good one
    expect(calls).toBe(3); // sr.size's first delivery never reached the handler
    expect(transport.replies).toBe(2);
  });
});
