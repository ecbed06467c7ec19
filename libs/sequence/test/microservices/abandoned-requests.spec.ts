import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport, type Transport } from 'nest-sequence';
import { ReplyTimeoutError, SequenceRecord } from 'nest-sequence/microservices';
import { ForwardingTransport } from 'nest-sequence/testing';
import { namedTransport, useRabbitMq } from '../support/rabbitmq.fixture';
import { eventually } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

jest.setTimeout(20_000);

const FRAGMENT_BYTES = 64 * 1024;
const CHUNK_BYTES = 64 * 1024;
/** How far a send may read on once stopped: the fragments in flight, one being filled, a chunk. */
const BOUND_BYTES = 4 * FRAGMENT_BYTES;

/** What the request and event handlers were called with. */
const asked: unknown[] = [];
const studies: string[] = [];

@Controller()
class Handlers {
  @MessagePattern('ab.ask')
  ask(@Payload() data: unknown) {
    asked.push(data);
    return 'answered';
  }

  @EventPattern('ab.study')
  async study(@Payload() data: Readable | Buffer) {
    const hash = createHash('sha256');
    if (Buffer.isBuffer(data)) hash.update(data);
    else for await (const chunk of data) hash.update(chunk as Buffer);
    studies.push(hash.digest('hex'));
  }
}

/** A study read slowly (a chunk every few ms, as from a disk or a socket), counting what it gave. */
class CountingSource extends Readable {
  bytesRead = 0;

  constructor(private readonly total: number) {
    super({ highWaterMark: CHUNK_BYTES });
  }

  override _read(): void {
    setTimeout(() => {
      if (this.destroyed) return;
      const size = Math.min(CHUNK_BYTES, this.total - this.bytesRead);
      if (size <= 0) {
        this.push(null);
        return;
      }
      this.bytesRead += size;
      this.push(patterned(size, this.bytesRead));
    }, 5);
  }
}

function patterned(size: number, seed: number): Buffer {
  const out = Buffer.alloc(size);
  for (let i = 0; i < size; i++) out[i] = (i * 31 + seed) & 0xff;
  return out;
}

/** The real transport, each publish to `channel` recorded and held `delayMs` first: a slow link. */
class SlowLink extends ForwardingTransport {
  readonly name = 'slow-link';
  /** The headers of each message published to the request channel. */
  readonly published: Array<Record<string, unknown>> = [];

  constructor(
    inner: Transport,
    private readonly channel: string,
    private readonly delayMs: number,
  ) {
    super(inner);
  }

  override async publish(...args: Parameters<Transport['publish']>): Promise<void> {
    const [channel, , headers] = args;
    if (channel === this.channel) {
      this.published.push({ ...headers });
      await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    }
    return super.publish(...args);
  }
}

const timedOut = (error: unknown) => error instanceof ReplyTimeoutError;

interface Broker {
  connect(): Promise<Transport>;
  channel(pattern: string): string;
}

type Closable = { close(): Promise<unknown> };

async function closeAll(opened: Closable[]): Promise<void> {
  for (const each of opened.splice(0).reverse()) await each.close();
}

/** The suite, on `broker`; what it opens goes to `opened`, closed by the caller after each test. */
function abandonedRequests(broker: () => Broker, opened: Closable[]): void {
  beforeEach(() => {
    asked.length = 0;
    studies.length = 0;
  });

  /** `maxSequenceBytes`: the server refuses larger sequences on the request channel. */
  async function start(
    replyTimeoutMs: number,
    publishDelayMs = 0,
    maxSequenceBytes?: number,
  ): Promise<{ t: MicroserviceTestApp; link: SlowLink }> {
    const channels = {
      'ab.ask': broker().channel('ab.ask'),
      'ab.study': broker().channel('ab.study'),
    };
    const channelOf = (pattern: string) => channels[pattern as keyof typeof channels] ?? pattern;
    const inner = await broker().connect();
    opened.push(inner);
    const link = new SlowLink(inner, channels['ab.ask'], publishDelayMs);
    const t = await createMicroserviceTestApp({
      sequence: {
        transport: link,
        sequence: { fragmentBytes: FRAGMENT_BYTES },
        claimCheck: { inlineMaxBytes: 256 * 1024, sequenceMaxBytes: 32 * 1024 * 1024 },
      },
      controllers: [Handlers],
      server: {
        channelOf,
        channels: maxSequenceBytes
          ? { [channels['ab.ask']]: { sequence: { maxSequenceBytes } } }
          : {},
      },
      client: { channelOf, replyTimeoutMs },
    });
    opened.push(t);
    return { t, link };
  }

  /** What `source` reads in `ms` more. */
  async function readOn(source: CountingSource, ms: number): Promise<number> {
    const before = source.bytesRead;
    await new Promise((resolve) => setTimeout(resolve, ms));
    return source.bytesRead - before;
  }

  it('stops reading a request sent as a Message Sequence once send() times out', async () => {
    const { t, link } = await start(300);
    const source = new CountingSource(16 * 1024 * 1024);
    const request = new SequenceRecord(source, { bytes: 16 * 1024 * 1024 });
    const error: unknown = await lastValueFrom(t.client.send('ab.ask', request)).catch(
      (caught: unknown) => caught,
    );
    expect(timedOut(error)).toBe(true);
    expect(await readOn(source, 400)).toBeLessThanOrEqual(BOUND_BYTES);
    expect(source.destroyed).toBe(true);
    expect(source.bytesRead).toBeLessThan(16 * 1024 * 1024);
    expect(link.published.some((headers) => headers['x-sequence-last'] === true)).toBe(false);
    expect(asked).toEqual([]);
  });

  it('stops uploading a request sent behind a claim ticket once send() times out', async () => {
    const { t, link } = await start(300);
    const source = new CountingSource(16 * 1024 * 1024);
    // Of unknown size: parked in the payload store, its ticket published once it is stored.
    const error: unknown = await lastValueFrom(t.client.send('ab.ask', source)).catch(
      (caught: unknown) => caught,
    );
    expect(timedOut(error)).toBe(true);
    expect(await readOn(source, 400)).toBeLessThanOrEqual(BOUND_BYTES);
    expect(source.destroyed).toBe(true);
    expect(link.published).toEqual([]); // no ticket
    expect(asked).toEqual([]);
  });

  it('stops sending the fragments of a Buffer once its subscriber unsubscribes', async () => {
    const { t, link } = await start(10_000, 20);
    const study = patterned(8 * 1024 * 1024, 3); // 128 fragments, 20 ms each
    const waiting = t.client.send('ab.ask', study).subscribe({ error: () => undefined });
    await eventually(() => link.published.length >= 4, 'the upload under way');
    waiting.unsubscribe();
    const atUnsubscribe = link.published.length;
    await new Promise((resolve) => setTimeout(resolve, 400));
    // The one being published, and no other.
    expect(link.published.length - atUnsubscribe).toBeLessThanOrEqual(2);
    expect(link.published.some((headers) => headers['x-sequence-last'] === true)).toBe(false);
    expect(asked).toEqual([]);
  });

  it('stops sending a request once the server has refused it', async () => {
    const { t, link } = await start(10_000, 0, 256 * 1024);
    const source = new CountingSource(16 * 1024 * 1024);
    const request = new SequenceRecord(source, { bytes: 16 * 1024 * 1024 });
    // Refused at its first fragment, for its declared size: the error reply comes at once.
    const error: unknown = await lastValueFrom(t.client.send('ab.ask', request)).catch(
      (caught: unknown) => caught,
    );
    expect((error as { message?: string }).message).toMatch(/^sequence-too-large: /);
    expect(await readOn(source, 400)).toBeLessThanOrEqual(BOUND_BYTES);
    expect(source.destroyed).toBe(true);
    expect(source.bytesRead).toBeLessThan(8 * 1024 * 1024);
    expect(link.published.some((headers) => headers['x-sequence-last'] === true)).toBe(false);
    expect(asked).toEqual([]);
  });

  it('does not cut an emit() short when its subscriber unsubscribes', async () => {
    const { t } = await start(300);
    const source = new CountingSource(2 * 1024 * 1024);
    const hash = createHash('sha256');
    for (let read = 0; read < 2 * 1024 * 1024; read += CHUNK_BYTES) {
      hash.update(patterned(CHUNK_BYTES, read + CHUNK_BYTES));
    }
    t.client
      .emit('ab.study', new SequenceRecord(source, { bytes: 2 * 1024 * 1024 }))
      .subscribe()
      .unsubscribe();
    await eventually(() => studies.length === 1, 'the study handled', 10_000);
    expect(studies).toEqual([hash.digest('hex')]);
  });
}

describe('microservices: a send() nobody waits for on the in-memory transport', () => {
  const opened: Closable[] = [];
  afterEach(() => closeAll(opened));
  abandonedRequests(
    () => ({
      connect: () => Promise.resolve(new InMemoryTransport()),
      channel: (pattern) => pattern,
    }),
    opened,
  );
});

describeWithServer('rabbitmq', 'microservices: a send() nobody waits for on RabbitMQ', () => {
  const opened: Closable[] = [];
  // The apps and transports close before their queues are deleted.
  const rabbit = useRabbitMq({ beforeCleanup: () => closeAll(opened) });
  abandonedRequests(
    () => ({
      connect: () => namedTransport(`abandoned-requests-${Date.now()}`),
      channel: () => rabbit.admin.newChannel(),
    }),
    opened,
  );
});
