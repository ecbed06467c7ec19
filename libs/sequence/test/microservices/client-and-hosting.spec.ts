import { createReadStream } from 'node:fs';
import { Readable } from 'node:stream';
import {
  Controller,
  Inject,
  Injectable,
  Logger,
  Module,
  ValidationPipe,
  type OnModuleInit,
} from '@nestjs/common';
import { IsString } from 'class-validator';
import { NestFactory } from '@nestjs/core';
import {
  ClientsModule,
  EventPattern,
  MessagePattern,
  Payload,
  type ClientProxy,
} from '@nestjs/microservices';
import { InvalidMessageException } from '@nestjs/microservices/errors/invalid-message.exception';
import { Test } from '@nestjs/testing';
import { firstValueFrom, lastValueFrom } from 'rxjs';
import {
  ClaimCheck,
  type ClaimedPayload,
  InMemoryTransport,
  PublishRejectedError,
  SequenceHandlerConflictError,
  SequenceModule,
  SequenceOptionsError,
  type Transport,
} from 'nest-sequence';
import type { Subscription } from 'nest-sequence/ports';
import {
  ClientClosedError,
  ReplyNotSupportedError,
  SequenceClient,
  SequenceRecord,
  SequenceServer,
} from 'nest-sequence/microservices';
import { ForwardingTransport } from 'nest-sequence/testing';
import { CLIENT, createMicroserviceTestApp } from './microservice-test-app';
import { eventually } from '../support/sequence-test-app';

/** Refuses every publish, as a broker that is gone would after the retries. */
class RefusingTransport extends ForwardingTransport {
  readonly name = 'refusing';
  attempts = 0;
  override publish(channel: string): Promise<void> {
    this.attempts += 1;
    return Promise.reject(
      new PublishRejectedError(channel, new Error('the broker is unreachable')),
    );
  }
}

/** Confirms each publish after `delayMs`. */
class SlowPublishes extends ForwardingTransport {
  readonly name = 'slow-publishes';
  delayMs = 30;
  override async publish(...args: Parameters<Transport['publish']>): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    return super.publish(...args);
  }
}

/** Opens its reply channels once `open()` is called: a broker slow to declare the queue. */
class HeldReplyChannels extends ForwardingTransport {
  readonly name = 'held-reply-channels';
  readonly published: string[] = [];
  private opened!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.opened = resolve));

  open(): void {
    this.opened();
  }

  override publish(...args: Parameters<Transport['publish']>): Promise<void> {
    this.published.push(args[0]);
    return super.publish(...args);
  }

  override async openReplyChannel(
    ...args: Parameters<NonNullable<Transport['openReplyChannel']>>
  ): Promise<Subscription> {
    await this.gate;
    return super.openReplyChannel!(...args);
  }
}

/** A transport that cannot route replies: everything but openReplyChannel. */
class NoRepliesTransport extends ForwardingTransport {
  readonly name = 'no-replies';

  constructor(inner: Transport) {
    super(inner, ['openReplyChannel', 'isReplyChannel']);
  }
}

const received: unknown[] = [];

class Note {
  @IsString() text!: string;
}

@Controller()
class Notes {
  @EventPattern('host.notes')
  take(@Payload() note: Note) {
    received.push(note);
  }
}

@Controller()
class Handlers {
  @EventPattern('host.in')
  take(@Payload() data: unknown) {
    received.push(data);
  }
}

@Controller()
class Replier {
  @MessagePattern('host.ask')
  answer(@Payload() data: unknown) {
    return data;
  }
}

let answerHeld: (() => void) | undefined;

@Controller()
class HeldReplier {
  @MessagePattern('host.held')
  async answer() {
    await new Promise<void>((resolve) => (answerHeld = resolve));
    return 'too late';
  }
}

@Injectable()
class Decorated {
  @ClaimCheck({ channel: 'host.decorated' })
  async take(payload: ClaimedPayload) {
    received.push({ decorated: (await payload.toBuffer()).toString() });
  }
}

@Injectable()
class Conflicting {
  @ClaimCheck({ channel: 'host.in' })
  take() {}
}

const settle = (transport: InMemoryTransport) => transport.whenIdle();

beforeEach(() => {
  received.length = 0;
});

describe('SequenceClient.emit', () => {
  it('errors to its subscriber once the publish retries are spent', async () => {
    const inner = new InMemoryTransport();
    const transport = new RefusingTransport(inner);
    const t = await createMicroserviceTestApp({
      sequence: {
        transport,
        publish: { retry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 2 } },
      },
      controllers: [Handlers],
    });
    try {
      await expect(lastValueFrom(t.client.emit('host.in', { n: 1 }))).rejects.toThrow(
        /not confirmed after 3 attempt\(s\)/,
      );
      expect(transport.attempts).toBe(3);
    } finally {
      await t.close();
      await inner.close();
    }
  });

  /** A client whose every publish is refused (one attempt), and the errors its logger wrote. */
  async function withRefusedPublishes(
    run: (client: SequenceClient, errors: string[]) => Promise<void>,
  ): Promise<void> {
    const inner = new InMemoryTransport();
    const transport = new RefusingTransport(inner);
    const t = await createMicroserviceTestApp({
      sequence: { transport, publish: { retry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 } } },
      controllers: [Handlers],
    });
    const errors: string[] = [];
    const spy = jest
      .spyOn(Logger.prototype, 'error')
      .mockImplementation((message: unknown) => void errors.push(String(message)));
    try {
      await run(t.client, errors);
    } finally {
      spy.mockRestore();
      await t.close();
      await inner.close();
    }
  }

  it('logs a failure nobody subscribed to, rather than losing it unseen', () =>
    withRefusedPublishes(async (client, errors) => {
      client.emit('host.in', { n: 2 }); // nobody subscribes
      await eventually(() => errors.length > 0, 'the failure logged');
      expect(errors[0]).toMatch(
        /emit to host\.in failed and nobody subscribed.*not confirmed after 1 attempt/,
      );
    }));

  it('refuses null and undefined data as Nest does, logged when nobody subscribed', () =>
    withRefusedPublishes(async (client, errors) => {
      client.emit('host.in', null); // nobody subscribes
      client.emit('host.in', undefined);
      await eventually(() => errors.length === 2, 'both refusals logged');
      for (const error of errors) {
        expect(error).toMatch(/emit to host\.in failed and nobody subscribed.*invalid data/i);
      }
      await expect(lastValueFrom(client.emit('host.in', null))).rejects.toBeInstanceOf(
        InvalidMessageException,
      );
    }));

  it('logs a failure whose only subscriber unsubscribed before it came', () =>
    withRefusedPublishes(async (client, errors) => {
      const seen: unknown[] = [];
      // A component destroyed, take(0), a timeout() that fired: gone before the failure.
      client
        .emit('host.in', { n: 3 })
        .subscribe({ error: (e) => seen.push(e) })
        .unsubscribe();
      await eventually(() => errors.length > 0, 'the failure logged');
      expect(errors[0]).toMatch(/emit to host\.in failed and nobody subscribed/);
      expect(seen).toEqual([]);
    }));

  it('does not log a failure its subscriber was told of', () =>
    withRefusedPublishes(async (client, errors) => {
      await expect(lastValueFrom(client.emit('host.in', { n: 4 }))).rejects.toThrow(
        /not confirmed/,
      );
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(errors.filter((e) => e.includes('host.in'))).toEqual([]);
    }));

  it('sends without a subscriber: the message is delivered all the same', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({ sequence: { transport }, controllers: [Handlers] });
    try {
      t.client.emit('host.in', { fire: 'and forget' });
      await new Promise((resolve) => setTimeout(resolve, 20));
      await settle(transport);
      expect(received).toEqual([{ fire: 'and forget' }]);
    } finally {
      await t.close();
    }
  });

  it('has the shutdown wait for the emits under way, and no longer than shutdownTimeoutMs for those started meanwhile', async () => {
    const inner = new InMemoryTransport();
    const transport = new SlowPublishes(inner);
    const t = await createMicroserviceTestApp({
      sequence: { transport, shutdownTimeoutMs: 200 },
      controllers: [Handlers],
    });
    const order: string[] = [];
    transport.delayMs = 600; // longer than shutdownTimeoutMs: waited for all the same
    const underWay = lastValueFrom(t.client.emit('host.in', { n: 'under way' }));
    void underWay.then(() => order.push('confirmed'));
    await new Promise((resolve) => setTimeout(resolve, 10));
    transport.delayMs = 100;
    // A steady producer (a request handler under load): its emits overlap (ten at a time), so
    // some are always under way while the application stops.
    const steady = setInterval(() => {
      t.client.emit('host.in', { n: 'steady' }).subscribe({ error: () => undefined });
    }, 10);
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const warnings = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      await new Promise((resolve) => setTimeout(resolve, 50));
      const closing = t.close().then(() => order.push('closed'));
      const late = new Promise((resolve) => setTimeout(() => resolve('still closing'), 5_000));

      await expect(Promise.race([closing, late])).resolves.not.toBe('still closing');
      expect(order).toEqual(['confirmed', 'closed']);
      expect(warnings.mock.calls.map(([message]) => String(message))).toContainEqual(
        expect.stringMatching(/SequenceClient stopped waiting for \d+ emit\(\) sends? started/),
      );
    } finally {
      clearInterval(steady);
      errors.mockRestore();
      warnings.mockRestore();
      await inner.close();
    }
  });

  it('emits one value once confirmed, as Nest’s clients do: lastValueFrom needs no default', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({ sequence: { transport }, controllers: [Handlers] });
    try {
      const emitted = t.client.emit('host.in', { awaited: 'last' });
      await expect(lastValueFrom(emitted)).resolves.toBeUndefined();
      // A subscriber that comes after the confirm hears of it too.
      await expect(firstValueFrom(emitted)).resolves.toBeUndefined();
      await expect(firstValueFrom(t.client.emit('host.in', { awaited: 'first' }))).resolves.toBe(
        undefined,
      );
      await settle(transport);
      expect(received).toEqual([{ awaited: 'last' }, { awaited: 'first' }]);
    } finally {
      await t.close();
    }
  });

  it('needs a SequenceModule in the application', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [ClientsModule.register([{ name: CLIENT, customClass: SequenceClient }])],
    }).compile();
    const app = await moduleRef.init();
    try {
      const client = app.get<SequenceClient>(CLIENT);
      await expect(lastValueFrom(client.emit('host.in', { n: 1 }))).rejects.toThrow(
        /no SequenceModule in this application/,
      );
    } finally {
      await app.close();
    }
  });
});

describe('SequenceClient at startup', () => {
  /** Connects and emits as its module starts, as a service announcing itself does. */
  @Injectable()
  class Announcer implements OnModuleInit {
    constructor(@Inject(CLIENT) private readonly client: ClientProxy) {}

    async onModuleInit(): Promise<void> {
      await this.client.connect();
      await lastValueFrom(this.client.emit('host.in', { started: true }));
    }
  }

  @Module({
    imports: [ClientsModule.register([{ name: CLIENT, customClass: SequenceClient }])],
    providers: [Announcer],
  })
  class AnnouncerModule {}

  it('serves the onModuleInit of a module listed before SequenceModule', async () => {
    const transport = new InMemoryTransport();
    // AnnouncerModule first: its onModuleInit runs before SequenceModule's.
    const moduleRef = await Test.createTestingModule({
      imports: [AnnouncerModule, SequenceModule.forRoot({ transport })],
    }).compile();
    moduleRef.useLogger(['error']);
    try {
      await moduleRef.init();
      expect(transport.depth('host.in')).toBe(1);
    } finally {
      await moduleRef.close();
    }
  });
});

describe('SequenceClient: a stream it cannot send', () => {
  /** A stream that stays open until read or destroyed, as a file's does. */
  const openStream = () => new Readable({ read() {} });

  it('destroys the stream of a send() refused on a transport without reply channels', async () => {
    const inner = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport: new NoRepliesTransport(inner) },
      controllers: [Handlers],
    });
    try {
      const source = openStream();
      await expect(lastValueFrom(t.client.send('host.ask', source))).rejects.toThrow(
        ReplyNotSupportedError,
      );
      expect(source.destroyed).toBe(true);
    } finally {
      await t.close();
      await inner.close();
    }
  });

  it.each([
    [
      'emit',
      (client: SequenceClient, source: Readable) =>
        client.emit('host.in', new SequenceRecord(source, { bytes: 10 })),
    ],
    ['send', (client: SequenceClient, source: Readable) => client.send('host.ask', source)],
  ] as const)('destroys the stream of a %s() without a SequenceModule', async (_, call) => {
    const moduleRef = await Test.createTestingModule({
      imports: [ClientsModule.register([{ name: CLIENT, customClass: SequenceClient }])],
    }).compile();
    const app = await moduleRef.init();
    try {
      const source = openStream();
      await expect(lastValueFrom(call(app.get<SequenceClient>(CLIENT), source))).rejects.toThrow(
        /no SequenceModule/,
      );
      expect(source.destroyed).toBe(true);
    } finally {
      await app.close();
    }
  });

  it('destroys the stream of a send() unsubscribed before its request is sent', async () => {
    const inner = new InMemoryTransport();
    const transport = new HeldReplyChannels(inner);
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Replier],
    });
    try {
      // Unsubscribed at once: before the client connected.
      const first = openStream();
      t.client.send('host.ask', first).subscribe().unsubscribe();
      // Unsubscribed while the reply channel opens.
      const second = openStream();
      const waiting = t.client.send('host.ask', second).subscribe();
      await new Promise((resolve) => setTimeout(resolve, 20));
      waiting.unsubscribe();
      transport.open();
      await eventually(() => first.destroyed && second.destroyed, 'both streams destroyed');
      await settle(inner);
      expect(transport.published).toEqual([]); // nobody waits for an answer
    } finally {
      await t.close();
      await inner.close();
    }
  });

  it('fails the send() of a file that cannot be opened while its reply channel opens, and nothing else', async () => {
    const inner = new InMemoryTransport();
    const transport = new HeldReplyChannels(inner);
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Replier],
    });
    try {
      const missing = createReadStream('/nonexistent/nest-sequence/request');
      const answer = lastValueFrom(t.client.send('host.ask', missing));
      answer.catch(() => undefined);
      // The file's open fails while the request waits for its reply channel: the error is the
      // request's, not an uncaught exception (jest would fail the test with it).
      await eventually(() => missing.destroyed, 'the open failed');
      transport.open();
      await expect(answer).rejects.toThrow(/ENOENT/);
      expect(transport.published).toEqual([]);
    } finally {
      await t.close();
      await inner.close();
    }
  });

  it('destroys the stream of an emit() refused for its pattern', async () => {
    const inner = new InMemoryTransport();
    const t = await createMicroserviceTestApp({ sequence: { transport: inner } });
    try {
      const source = openStream();
      await expect(lastValueFrom(t.client.emit(undefined, source))).rejects.toBeInstanceOf(
        InvalidMessageException,
      );
      expect(source.destroyed).toBe(true);
    } finally {
      await t.close();
      await inner.close();
    }
  });
});

describe('SequenceClient.close', () => {
  it('errors the send() calls still waiting with ClientClosedError', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [HeldReplier],
      client: { replyTimeoutMs: 10_000 },
    });
    try {
      const waiting = lastValueFrom(t.client.send('host.held', { n: 1 }));
      waiting.catch(() => undefined);
      await eventually(() => answerHeld !== undefined, 'the handler called');
      await t.client.close();
      const error: unknown = await waiting.then(
        () => undefined,
        (caught: unknown) => caught,
      );
      expect(error).toBeInstanceOf(ClientClosedError);
      expect(error).toMatchObject({ code: 'client-closed', pattern: 'host.held' });
      expect((error as ClientClosedError).correlationId).toEqual(expect.any(String));
      expect((error as Error).message).toMatch(
        /^SequenceClient closed before the reply to host\.held \(correlation id [^)]+\) came/,
      );
    } finally {
      answerHeld?.();
      await t.close();
    }
  });
});

describe('SequenceServer hosting', () => {
  it('serves a hybrid application whose microservices start before it listens', async () => {
    const transport = new InMemoryTransport();
    @Module({
      imports: [
        SequenceModule.forRoot({ transport }),
        ClientsModule.register([{ name: CLIENT, customClass: SequenceClient }]),
      ],
      controllers: [Handlers],
    })
    class HybridModule {}
    const app = await NestFactory.create(HybridModule, { logger: ['error'] });
    app.connectMicroservice({ strategy: new SequenceServer() });
    try {
      await app.startAllMicroservices(); // before init, as Nest's docs write it
      await app.init();
      await lastValueFrom(app.get<SequenceClient>(CLIENT).emit('host.in', { hybrid: true }), {
        defaultValue: undefined,
      });
      await settle(transport);
      expect(received).toEqual([{ hybrid: true }]);
    } finally {
      await app.close();
    }
  });

  it('runs side by side with the module’s own decorators', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Handlers],
      providers: [Decorated],
    });
    try {
      await lastValueFrom(t.client.emit('host.in', { via: 'pattern' }), {
        defaultValue: undefined,
      });
      await transport.publish('host.decorated', Buffer.from('by decorator'), {});
      await settle(transport);
      expect(received).toEqual(
        expect.arrayContaining([{ via: 'pattern' }, { decorated: 'by decorator' }]),
      );
    } finally {
      await t.close();
    }
  });

  it('refuses to listen on a channel a decorated handler already consumes', async () => {
    await expect(
      createMicroserviceTestApp({
        sequence: { transport: new InMemoryTransport() },
        controllers: [Handlers],
        providers: [Conflicting],
      }),
    ).rejects.toThrow(SequenceHandlerConflictError);
  });

  it('refuses @MessagePattern on a transport that cannot route replies, saying so', async () => {
    const inner = new InMemoryTransport();
    const transport: Transport = new NoRepliesTransport(inner);
    try {
      await expect(
        createMicroserviceTestApp({ sequence: { transport }, controllers: [Replier] }),
      ).rejects.toThrow(ReplyNotSupportedError);
      await expect(
        createMicroserviceTestApp({ sequence: { transport }, controllers: [Replier] }),
      ).rejects.toThrow(/cannot route replies.*Use @EventPattern and emit\(\)/);
    } finally {
      await inner.close();
    }
  });

  it('applies the application’s global pipes', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Notes],
      configure: (app) => app.useGlobalPipes(new ValidationPipe()),
    });
    try {
      await lastValueFrom(t.client.emit('host.notes', { text: 'ok' }), { defaultValue: undefined });
      await lastValueFrom(t.client.emit('host.notes', { text: 42 }), { defaultValue: undefined });
      await settle(transport);
      expect(received).toEqual([{ text: 'ok' }]);
      const dead = transport.take(transport.deadLetterChannel('host.notes'));
      expect(dead.map((message) => String(message.headers['x-death-reason']))).toEqual([
        expect.stringMatching(/^invalid-payload: .*text must be a string/),
      ]);
    } finally {
      await t.close();
    }
  });

  it('refuses options it does not know', () => {
    expect(() => new SequenceServer({ chanels: {} } as never)).toThrow(
      /chanels is not an option; the options are channels, channelOf/,
    );
    expect(() => new SequenceClient({ replyTimeout: 5 } as never)).toThrow(
      /replyTimeout is not an option; the options are replyTimeoutMs/,
    );
  });

  it('refuses channel options given as null when built, naming the channel', () => {
    // An empty key in a config file: the channel took the module's defaults without a word.
    const built = () =>
      new SequenceServer({
        channels: { 'host.in': null as never, 'host.ordered': { resequence: null as never } },
      });
    expect(built).toThrow(SequenceOptionsError);
    expect(built).toThrow(
      /invalid SequenceServer:[\s\S]*channels\.host\.in is null[\s\S]*channels\.host\.ordered\.resequence is null/,
    );
  });

  it("refuses a resequenced channel's options that do not apply to it, or given twice, when built", () => {
    // Dropped without a word, they left the channel on defaults its operator did not choose.
    const gap = { timeoutMs: 60_000, policy: 'alert' } as const;
    const built = () =>
      new SequenceServer({
        channels: {
          'host.ordered': { resequence: { gap }, deleteAfter: 'ack', bogus: 1 } as never,
          'host.twice': { resequence: { gap, handlerTimeoutMs: 5 }, handlerTimeoutMs: 10 },
        },
      });
    expect(built).toThrow(SequenceOptionsError);
    expect(built).toThrow(
      /channels\.host\.ordered\.deleteAfter does not apply to a resequenced channel[\s\S]*channels\.host\.ordered\.bogus does not apply[\s\S]*channels\.host\.twice\.handlerTimeoutMs is given both beside and inside resequence/,
    );
    expect(
      () =>
        new SequenceServer({
          channels: {
            'host.ordered': {
              resequence: { gap },
              prefetch: 4,
              deadLetterChannel: 'host.ordered.dead',
              handlerRetry: { attempts: 2 },
              handlerTimeoutMs: 1_000,
            },
          },
        }),
    ).not.toThrow();
  });

  it('refuses a size threshold that is not a whole number of bytes when built', () => {
    // They were kept as given and failed every emit() and send() later instead.
    expect(() => new SequenceClient({ inlineMaxBytes: '65536' as never })).toThrow(
      /invalid SequenceClient:[\s\S]*inlineMaxBytes must be an integer >= 0, got the string "65536"/,
    );
    expect(() => new SequenceClient({ sequenceMaxBytes: NaN, inlineMaxBytes: -1 })).toThrow(
      /inlineMaxBytes must be an integer >= 0, got -1[\s\S]*sequenceMaxBytes must be an integer >= 0, got NaN/,
    );
    expect(() => new SequenceClient({ inlineMaxBytes: 0, sequenceMaxBytes: 1024 })).not.toThrow();
  });

  it('refuses channel options for a channel no handler consumes', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport: new InMemoryTransport() })],
      controllers: [Handlers],
    }).compile();
    const app = moduleRef.createNestMicroservice({
      strategy: new SequenceServer({ channels: { 'host.typo': { prefetch: 2 } } }),
      logger: false,
    });
    try {
      await expect(app.listen()).rejects.toThrow(/no handler consumes host\.typo/);
    } finally {
      await app.close();
    }
  });
});
