import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { MessageRefusedError } from 'nest-sequence/microservices';
import { deathReasonOf } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

/** The server's maxJsonBytes. */
const SERVER_MAX_JSON = 4 * 1024;
/** The client's maxJsonBytes and maxReplyBytes: apart, to tell which one refused a reply. */
const CLIENT_MAX_JSON = 2 * 1024;
const CLIENT_MAX_REPLY = 6 * 1024;
/** Payloads larger than this travel as a Message Sequence. */
const INLINE_MAX = 8 * 1024;

/**
 * A JSON value whose encoding (`{"text":"xx…"}`) is exactly `bytes` long (the refusals below name
 * the size they saw).
 */
function jsonOf(bytes: number): { text: string } {
  return { text: 'x'.repeat(bytes - '{"text":""}'.length) };
}

const received: { pattern: string; data: unknown }[] = [];

@Controller()
class Limits {
  @EventPattern('pl.json')
  json(@Payload() data: unknown) {
    received.push({ pattern: 'pl.json', data });
  }

  @MessagePattern('pl.ask')
  ask(@Payload() data: unknown) {
    received.push({ pattern: 'pl.ask', data });
    return 'read';
  }

  /** Replies with `bytes` bytes, as binary data. */
  @MessagePattern('pl.bytes')
  bytes(@Payload() data: { bytes: number }) {
    return Buffer.alloc(data.bytes, 7);
  }

  /** Replies with JSON `bytes` long. */
  @MessagePattern('pl.json-reply')
  jsonReply(@Payload() data: { bytes: number }) {
    return jsonOf(data.bytes);
  }
}

/**
 * The microservices size limits (docs/microservices.md, options reference; docs/security.md,
 * budgets): the server's `maxJsonBytes` (larger JSON is dead-lettered `undecodable`, unparsed),
 * the client's `maxJsonBytes` and `maxReplyBytes` (a larger reply errors as `undecodable`).
 */
describe('microservices: maxJsonBytes and maxReplyBytes', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 4 * 1024 },
        claimCheck: { inlineMaxBytes: INLINE_MAX, sequenceMaxBytes: 1024 * 1024 },
        handlerRetry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 1 },
      },
      controllers: [Limits],
      server: { maxJsonBytes: SERVER_MAX_JSON },
      client: {
        replyTimeoutMs: 5_000,
        maxJsonBytes: CLIENT_MAX_JSON,
        maxReplyBytes: CLIENT_MAX_REPLY,
      },
      logger: false,
    });
  });

  afterAll(() => t?.close());

  const deadLetters = (channel: string) => transport.take(transport.deadLetterChannel(channel));

  beforeEach(() => {
    received.length = 0;
    // What a failed test left there.
    for (const channel of ['pl.json', 'pl.ask']) deadLetters(channel);
  });

  const emit = (pattern: string, data: unknown) =>
    lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });
  const ask = (pattern: string, data: unknown): Promise<{ reply?: unknown; error?: unknown }> =>
    lastValueFrom(t.client.send(pattern, data)).then(
      (reply: unknown) => ({ reply }),
      (error: unknown) => ({ error }),
    );

  describe("the server's maxJsonBytes", () => {
    it('hands JSON of maxJsonBytes to the handler, parsed', async () => {
      const value = jsonOf(SERVER_MAX_JSON);
      await emit('pl.json', value);
      await transport.whenIdle();
      expect(received).toEqual([{ pattern: 'pl.json', data: value }]);
      expect(deadLetters('pl.json')).toEqual([]);
    });

    it.each([
      ['one byte larger, in one message', SERVER_MAX_JSON + 1, 'an inline payload: '],
      ['larger, as a Message Sequence', 3 * INLINE_MAX, 'sequence \\S+: '],
    ])(
      'dead-letters undecodable JSON %s, without calling the handler',
      async (_what, bytes, sequence) => {
        await emit('pl.json', jsonOf(bytes));
        await transport.whenIdle();
        expect(received).toEqual([]);
        // Not retried: one dead letter, for the message or the fragment that completed it.
        const dead = deadLetters('pl.json');
        expect(dead.map(deathReasonOf)).toEqual([
          expect.stringMatching(
            new RegExp(
              `^undecodable: ${sequence}a ${bytes}-byte JSON payload is larger than ` +
                `maxJsonBytes \\(${SERVER_MAX_JSON}\\)`,
            ),
          ),
        ]);
      },
    );

    it('takes larger payloads of another content type', async () => {
      await emit('pl.json', Buffer.alloc(2 * SERVER_MAX_JSON, 1));
      await transport.whenIdle();
      expect(received).toEqual([
        { pattern: 'pl.json', data: Buffer.alloc(2 * SERVER_MAX_JSON, 1) },
      ]);
      expect(deadLetters('pl.json')).toEqual([]);
    });

    it('answers a request with larger JSON with the refusal, without calling the handler', async () => {
      expect(await ask('pl.ask', jsonOf(SERVER_MAX_JSON))).toEqual({ reply: 'read' });
      expect(received).toHaveLength(1);
      received.length = 0;

      const answer = await ask('pl.ask', jsonOf(SERVER_MAX_JSON + 1));
      expect(answer).toEqual({
        error: {
          status: 'error',
          message: expect.stringMatching(
            new RegExp(
              `^undecodable: a ${SERVER_MAX_JSON + 1}-byte JSON payload is larger than ` +
                `maxJsonBytes \\(${SERVER_MAX_JSON}\\)`,
            ),
          ),
        },
      });
      await transport.whenIdle();
      expect(received).toEqual([]);
      // The caller has the error: the request is not dead-lettered.
      expect(deadLetters('pl.ask')).toEqual([]);
    });
  });

  describe("the client's maxReplyBytes", () => {
    it('reads a reply of maxReplyBytes', async () => {
      const answer = await ask('pl.bytes', { bytes: CLIENT_MAX_REPLY });
      expect(answer).toEqual({ reply: Buffer.alloc(CLIENT_MAX_REPLY, 7) });
    });

    it.each([
      ['one byte larger, in one message', CLIENT_MAX_REPLY + 1, 1],
      ['larger, as a Message Sequence', 3 * INLINE_MAX, 6],
    ])('errors send() as undecodable for a reply %s', async (_what, bytes, messages) => {
      const publish = jest.spyOn(transport, 'publish');
      let error: unknown;
      try {
        ({ error } = await ask('pl.bytes', { bytes }));
        const replies = publish.mock.calls.filter(([channel]) => transport.isReplyChannel(channel));
        expect(replies).toHaveLength(messages);
      } finally {
        publish.mockRestore();
      }
      expect(error).toBeInstanceOf(MessageRefusedError);
      expect(error).toMatchObject({
        code: 'undecodable',
        message: expect.stringMatching(
          new RegExp(
            `^a ${bytes}-byte reply to pl\\.bytes is larger than maxReplyBytes ` +
              `\\(${CLIENT_MAX_REPLY}\\)`,
          ),
        ),
      });
    });
  });

  describe("the client's maxJsonBytes", () => {
    it('reads a JSON reply of maxJsonBytes', async () => {
      expect(await ask('pl.json-reply', { bytes: CLIENT_MAX_JSON })).toEqual({
        reply: jsonOf(CLIENT_MAX_JSON),
      });
    });

    it('errors send() as undecodable for a larger JSON reply, under maxReplyBytes', async () => {
      const { error } = await ask('pl.json-reply', { bytes: CLIENT_MAX_JSON + 1 });
      expect(error).toBeInstanceOf(MessageRefusedError);
      expect(error).toMatchObject({
        code: 'undecodable',
        message: expect.stringMatching(
          new RegExp(
            `^a ${CLIENT_MAX_JSON + 1}-byte JSON payload is larger than maxJsonBytes ` +
              `\\(${CLIENT_MAX_JSON}\\)`,
          ),
        ),
      });
    });
  });
});
