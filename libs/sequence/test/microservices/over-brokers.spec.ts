import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { Controller, UsePipes, ValidationPipe } from '@nestjs/common';
import {
  ClientsModule,
  Ctx,
  EventPattern,
  MessagePattern,
  Payload,
  RpcException,
} from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { IsString } from 'class-validator';
import { lastValueFrom } from 'rxjs';
import { SequenceModule, type Transport } from 'nest-sequence';
import {
  SequenceClient,
  SequenceRecord,
  type SequenceContext,
  type SequenceServerOptions,
} from 'nest-sequence/microservices';
import { amqpConnection, namedTransport, useRabbitMq } from '../support/rabbitmq.fixture';
import { eventually } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import { describeOnTransports, useTransportAdmin } from '../support/transports.fixture';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

jest.setTimeout(60_000);

class Study {
  @IsString() studyId!: string;
}

interface Seen {
  pattern: string;
  via: string;
  fragments: number;
  sha256: string;
}

const seen: Seen[] = [];

async function digest(data: unknown): Promise<string> {
  const hash = createHash('sha256');
  if (data instanceof Readable) for await (const chunk of data) hash.update(chunk as Buffer);
  else hash.update(Buffer.isBuffer(data) ? data : JSON.stringify(data));
  return hash.digest('hex');
}

@Controller()
class Studies {
  @EventPattern('bk.study')
  async study(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    seen.push({
      pattern: ctx.getPattern(),
      via: ctx.getVia(),
      fragments: ctx.getFragments(),
      sha256: await digest(data),
    });
  }

  @EventPattern('bk.metadata')
  @UsePipes(new ValidationPipe())
  metadata(@Payload() study: Study, @Ctx() ctx: SequenceContext) {
    seen.push({
      pattern: ctx.getPattern(),
      via: ctx.getVia(),
      fragments: 1,
      sha256: study.studyId,
    });
  }
}

@Controller()
class Answers {
  @MessagePattern('bk.ask')
  ask(@Payload() request: { size: number }) {
    if (request.size < 0) throw new RpcException({ statusCode: 404, message: 'no such study' });
    return request.size === 0 ? { ok: true } : bytes(request.size);
  }
}

function bytes(size: number): Buffer {
  const out = Buffer.alloc(size);
  for (let i = 0; i < size; i++) out[i] = (i * 31 + 7) & 0xff;
  return out;
}

const sha = (buffer: Buffer) => createHash('sha256').update(buffer).digest('hex');

/**
 * The microservices integration on the real brokers: events of every size, a pipe's refusal and
 * an unhandled pattern dead-lettered where the broker keeps dead letters, and request-reply.
 */
describeOnTransports('microservices: SequenceServer and SequenceClient', [], (on) => {
  const opened: Array<{ close(): Promise<unknown> }> = [];
  const broker = useTransportAdmin(on, {
    beforeCleanup: async () => {
      for (const each of opened.splice(0).reverse()) await each.close();
    },
  });

  beforeEach(() => {
    seen.length = 0;
  });

  const PATTERNS = ['bk.study', 'bk.metadata', 'bk.ask'];

  async function start(
    controller: typeof Studies | typeof Answers,
    limits: (channels: Record<string, string>) => SequenceServerOptions['channels'] = () => ({}),
  ): Promise<{
    t: MicroserviceTestApp;
    transport: Transport;
    channels: Record<string, string>;
  }> {
    const channels = Object.fromEntries(
      PATTERNS.map((pattern) => [pattern, broker.admin.newChannel()]),
    );
    const channelOf = (pattern: string) => channels[pattern] ?? channels['bk.study'];
    const transport = await on.connect(`microservices-${Date.now()}`);
    opened.push(transport);
    const t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 512 * 1024 },
        claimCheck: { inlineMaxBytes: 256 * 1024, sequenceMaxBytes: 4 * 1024 * 1024 },
      },
      controllers: [controller],
      server: { channelOf, streamAboveBytes: 1024 * 1024, channels: limits(channels) },
      client: { channelOf },
    });
    opened.push(t);
    return { t, transport, channels };
  }

  it('delivers JSON inline, a sequence and a claim-checked stream, each verified', async () => {
    const { t } = await start(Studies);
    const sequence = bytes(3 * 1024 * 1024 + 17);
    const ticketed = bytes(6 * 1024 * 1024);
    const emit = (data: unknown) =>
      lastValueFrom(t.client.emit('bk.study', data), { defaultValue: undefined });
    await emit({ studyId: 'CT-1' });
    await emit(sequence);
    await emit(new SequenceRecord(Readable.from([ticketed]), { contentType: 'application/dicom' }));
    await eventually(() => seen.length === 3, 'three payloads handled');
    const byVia = Object.fromEntries(seen.map((s) => [s.via, s]));
    expect(byVia.inline?.sha256).toBe(sha(Buffer.from(JSON.stringify({ studyId: 'CT-1' }))));
    expect(byVia.sequence?.sha256).toBe(sha(sequence));
    expect(byVia.sequence?.fragments).toBeGreaterThan(1);
    expect(byVia.ticket?.sha256).toBe(sha(ticketed));
  });

  it('dead-letters an invalid payload and an unhandled pattern, with their reasons', async () => {
    const { t, transport, channels } = await start(Studies);
    const emit = (pattern: string, data: unknown) =>
      lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });
    await emit('bk.metadata', { studyId: 42 });
    await emit('bk.unknown', { to: 'nobody' }); // sent to bk.study's channel
    await emit('bk.metadata', { studyId: 'CT-9' });
    await eventually(() => seen.length === 1, 'the valid payload handled');
    const reasons = async (pattern: string) =>
      (await broker.admin.drain(transport.deadLetterChannel(channels[pattern]))).map((message) =>
        String(message.headers['x-death-reason']),
      );
    let metadata: string[] = [];
    let study: string[] = [];
    await eventually(async () => {
      metadata = [...metadata, ...(await reasons('bk.metadata'))];
      study = [...study, ...(await reasons('bk.study'))];
      return metadata.length === 1 && study.length === 1;
    }, 'both dead letters');
    expect(metadata[0]).toMatch(/^invalid-payload: .*studyId must be a string/);
    expect(study[0]).toMatch(/^no-handler: .*"bk\.unknown"/);
    expect(seen).toEqual([{ pattern: 'bk.metadata', via: 'inline', fragments: 1, sha256: 'CT-9' }]);
  });

  it('confirms the emits in flight before the application closes', async () => {
    const { channels } = await start(Studies);
    const transport = await on.connect(`microservices-producer-${Date.now()}`);
    opened.push(transport);
    const producer = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          sequence: { fragmentBytes: 512 * 1024 },
          claimCheck: { inlineMaxBytes: 256 * 1024, sequenceMaxBytes: 4 * 1024 * 1024 },
        }),
        ClientsModule.register([
          {
            name: 'PRODUCER',
            customClass: SequenceClient,
            options: { channelOf: () => channels['bk.study'] },
          },
        ]),
      ],
    }).compile();
    producer.useLogger(false);
    await producer.init();
    const client = producer.get<SequenceClient>('PRODUCER');
    const sequence = bytes(2 * 1024 * 1024);
    // Fire and forget, as a request handler does; then the process stops (a rolling deploy),
    // closing the application, then the transport it owns.
    client.emit('bk.study', { studyId: 'CT-5' });
    client.emit('bk.study', sequence);
    await producer.close();
    await transport.close();
    await eventually(() => seen.length === 2, 'both payloads handled', 10_000);
    const byVia = Object.fromEntries(seen.map((s) => [s.via, s]));
    expect(byVia.inline?.sha256).toBe(sha(Buffer.from(JSON.stringify({ studyId: 'CT-5' }))));
    expect(byVia.sequence?.sha256).toBe(sha(sequence));
  });

  it('answers send() with small and large replies', async () => {
    const { t } = await start(Answers);
    await expect(lastValueFrom(t.client.send('bk.ask', { size: 0 }))).resolves.toEqual({
      ok: true,
    });
    const large = await lastValueFrom(t.client.send<Buffer>('bk.ask', { size: 3 * 1024 * 1024 }));
    expect(sha(large)).toBe(sha(bytes(3 * 1024 * 1024)));
  });

  it('errors send() with an RpcException’s object error, as it is', async () => {
    const { t } = await start(Answers);
    await expect(lastValueFrom(t.client.send('bk.ask', { size: -1 }))).rejects.toEqual({
      statusCode: 404,
      message: 'no such study',
    });
  });

  it('answers a request whose sequence the consumer refuses with the reason, at once', async () => {
    const { t, transport, channels } = await start(Answers, (named) => ({
      [named['bk.ask']]: { sequence: { maxSequenceBytes: 1024 * 1024 } },
    }));
    // Four fragments: the first refused for its size, any other sent for its sequence.
    const refused = await lastValueFrom(t.client.send('bk.ask', bytes(2 * 1024 * 1024))).catch(
      (error: unknown) => error,
    );
    expect(refused).toMatchObject({ status: 'error' });
    expect((refused as { message: string }).message).toMatch(/^sequence-too-large: /);
    // Each fragment sent before the refusal came back is dead-lettered; the client then stops
    // sending: a prefix of the four, none skipped.
    const positions: number[] = [];
    const drain = async () => {
      const dead = await broker.admin.drain(transport.deadLetterChannel(channels['bk.ask']));
      positions.push(...dead.map((message) => Number(message.headers['x-sequence-position'])));
    };
    await eventually(async () => {
      await drain();
      return positions.length > 0;
    }, 'the fragments sent dead-lettered');
    await new Promise((resolve) => setTimeout(resolve, 500));
    await drain();
    positions.sort((a, b) => a - b);
    expect(positions.length).toBeLessThanOrEqual(4);
    expect(positions).toEqual(positions.map((_, i) => positions[0] + i));
  });
});

/** Producers in other languages: what their AMQP clients put in the headers. */
describeWithServer('rabbitmq', 'microservices: a producer of another language on RabbitMQ', () => {
  const opened: Array<{ close(): Promise<unknown> }> = [];
  const broker = useRabbitMq({
    beforeCleanup: async () => {
      for (const each of opened.splice(0).reverse()) await each.close();
    },
  });

  beforeEach(() => {
    seen.length = 0;
  });

  it('routes by an x-pattern sent as a byte array', async () => {
    const channel = broker.admin.newChannel();
    const transport = await namedTransport(`microservices-bytes-${Date.now()}`);
    opened.push(transport);
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Studies],
      server: { channelOf: () => channel },
    });
    opened.push(t);
    // A Java client's byte[] header, Python's bytes: an AMQP byte array, a Buffer to amqplib.
    const connection = await amqpConnection();
    try {
      const amqp = await connection.createChannel();
      amqp.sendToQueue(channel, Buffer.from(JSON.stringify({ studyId: 'CT-7' })), {
        headers: { 'x-pattern': Buffer.from('bk.metadata'), 'content-type': 'application/json' },
      });
      await amqp.close();
    } finally {
      await connection.close();
    }
    await eventually(() => seen.length === 1, 'the payload handled by its pattern');
    expect(seen).toEqual([{ pattern: 'bk.metadata', via: 'inline', fragments: 1, sha256: 'CT-7' }]);
  });

  it.each([
    ['its message', '{"status":"error","message":"out of stock"}', 'out of stock'],
    ['no body at all', 'null', 'an error reply without a message (body null)'],
  ])(
    'errors send() with a reply whose headers come as byte arrays, an error with %s',
    async (_, body, message) => {
      const channel = broker.admin.newChannel();
      const transport = await namedTransport(`microservices-bytes-reply-${Date.now()}`);
      opened.push(transport);
      const t = await createMicroserviceTestApp({
        sequence: { transport },
        client: { channelOf: () => channel, replyTimeoutMs: 20_000 },
      });
      opened.push(t);
      // The responder: another program, answering with its AMQP client's byte-array headers.
      const connection = await amqpConnection();
      opened.push(connection);
      const amqp = await connection.createChannel();
      await transport.subscribe(channel, async (request) => {
        amqp.sendToQueue(String(request.headers['x-reply-to']), Buffer.from(body), {
          headers: {
            'x-correlation-id': Buffer.from(String(request.headers['x-correlation-id'])),
            'x-reply-status': Buffer.from('error'),
            'content-type': 'application/json',
          },
        });
        return { action: 'ack' };
      });

      await expect(lastValueFrom(t.client.send('bk.ask-foreign', { sku: 'A-1' }))).rejects.toEqual({
        status: 'error',
        message,
      });
    },
  );

  it('hands a message RabbitMQ dead-lettered itself to the dead-letter channel’s handler', async () => {
    const channel = broker.admin.newChannel();
    const transport = await namedTransport(`microservices-broker-dlx-${Date.now()}`);
    opened.push(transport);
    const deadLetters = transport.deadLetterChannel(channel);
    const reasons: Array<string | undefined> = [];
    @Controller()
    class DeadLetters {
      @EventPattern(deadLetters)
      dead(@Payload() study: Study, @Ctx() ctx: SequenceContext) {
        seen.push({
          pattern: ctx.getPattern(),
          via: ctx.getVia(),
          fragments: 1,
          sha256: study.studyId,
        });
        reasons.push(ctx.getDeadLetterReason());
      }
    }
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [DeadLetters],
    });
    opened.push(t);
    // The channel's queue, dead-lettering into its dead-letter queue as the transport declares it;
    // a consumer of its own rejects the message without requeue, as the broker's limits
    // (delivery limit, TTL, max-length) dead-letter it too: with x-death, not x-death-reason.
    const connection = await amqpConnection();
    try {
      const amqp = await connection.createConfirmChannel();
      await amqp.assertQueue(channel, {
        durable: true,
        arguments: { 'x-dead-letter-exchange': '', 'x-dead-letter-routing-key': deadLetters },
      });
      amqp.sendToQueue(channel, Buffer.from(JSON.stringify({ studyId: 'CT-11' })), {
        headers: { 'x-pattern': 'bk.metadata', 'content-type': 'application/json' },
      });
      await amqp.waitForConfirms();
      const message = await amqp.get(channel);
      if (!message) throw new Error(`the message sent to ${channel} is not there`);
      amqp.nack(message, false, false);
      await amqp.close();
    } finally {
      await connection.close();
    }
    await eventually(() => seen.length === 1, 'the dead letter handled');
    expect(seen).toEqual([{ pattern: deadLetters, via: 'inline', fragments: 1, sha256: 'CT-11' }]);
    expect(reasons).toEqual([`rejected: dead-lettered by RabbitMQ from ${channel}`]);
  });

  it('decodes a JSON payload whose content-type is sent as a byte array', async () => {
    const channel = broker.admin.newChannel();
    const transport = await namedTransport(`microservices-bytes-ct-${Date.now()}`);
    opened.push(transport);
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Studies],
      server: { channelOf: () => channel },
    });
    opened.push(t);
    const connection = await amqpConnection();
    try {
      const amqp = await connection.createChannel();
      amqp.sendToQueue(channel, Buffer.from(JSON.stringify({ studyId: 'CT-8' })), {
        headers: { 'x-pattern': 'bk.metadata', 'content-type': Buffer.from('application/json') },
      });
      await amqp.close();
    } finally {
      await connection.close();
    }
    // Read as no content type, the payload would reach the ValidationPipe as a Buffer and be
    // dead-lettered instead.
    await eventually(() => seen.length === 1, 'the payload decoded as JSON and handled');
    expect(seen).toEqual([{ pattern: 'bk.metadata', via: 'inline', fragments: 1, sha256: 'CT-8' }]);
    expect(await broker.admin.drain(transport.deadLetterChannel(channel))).toEqual([]);
  });
});
