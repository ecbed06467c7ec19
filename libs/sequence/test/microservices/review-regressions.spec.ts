import {
  Catch,
  Controller,
  Logger,
  createParamDecorator,
  Injectable,
  Scope,
  UseFilters,
  UseGuards,
  UsePipes,
  ValidationPipe,
  type ArgumentsHost,
  type CanActivate,
  type ExecutionContext,
  type RpcExceptionFilter,
} from '@nestjs/common';
import {
  BaseRpcExceptionFilter,
  EventPattern,
  MessagePattern,
  ClientsModule,
  Payload,
  RpcException,
  Transport as NestTransport,
} from '@nestjs/microservices';
import { IsString } from 'class-validator';
import { firstValueFrom, lastValueFrom, of, throwError, timeout, type Observable } from 'rxjs';
import { InMemoryTransport, SequenceModule, type Subscription } from 'nest-sequence';
import type { MessageHandler, SubscribeOptions } from 'nest-sequence/ports';
import {
  MessageRefusedError,
  RpcHeader,
  SEQUENCE_TRANSPORT_ID,
  SequenceClient,
  SequenceRecord,
  SequenceServer,
  type SequenceContext,
} from 'nest-sequence/microservices';
import { ForwardingTransport } from 'nest-sequence/testing';
import { Test } from '@nestjs/testing';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

const calls: Record<string, number> = {};
const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);

function resetCalls(): void {
  for (const key of Object.keys(calls)) delete calls[key];
}

/** Emits through the app's client; resolves once the transport confirmed it. */
function emitVia(t: MicroserviceTestApp, pattern: string, data: unknown): Promise<unknown> {
  return lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });
}

/** The `x-death-reason` of each dead letter of `channel`, taken off its dead-letter channel. */
function deathReasons(transport: InMemoryTransport, channel: string): string[] {
  return transport
    .take(transport.deadLetterChannel(channel))
    .map((message) => String(message.headers['x-death-reason']));
}
let handlerName: string | undefined;

@Catch(RpcException)
class RpcToObservable implements RpcExceptionFilter<RpcException> {
  catch(exception: RpcException): Observable<never> {
    return throwError(() => exception.getError());
  }
}

@Catch()
class Swallow implements RpcExceptionFilter {
  catch(): Observable<string> {
    return of('handled by the filter');
  }
}

class Note {
  @IsString() text!: string;
}

/** The `x-note` header, as JSON: a custom parameter decorator, validated like a payload. */
const NoteHeader = createParamDecorator((_data: unknown, context: ExecutionContext) => {
  const ctx = context.switchToRpc().getContext<SequenceContext>();
  return JSON.parse(String(ctx.getHeaders()['x-note'])) as unknown;
});

@Injectable()
class NamesTheHandler implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    handlerName = context.getHandler().name;
    return true;
  }
}

abstract class BaseController {
  @EventPattern('rg.inherited')
  inherited() {
    count('inherited');
  }
}

@Controller()
class Regressions extends BaseController {
  @EventPattern('rg.filtered')
  @UseFilters(RpcToObservable)
  filtered() {
    count('filtered');
    throw new RpcException({ code: 'E42', why: 'archive offline' });
  }

  @EventPattern('rg.swallowed')
  @UseFilters(Swallow)
  swallowed() {
    count('swallowed');
    throw new Error('the filter takes this');
  }

  @EventPattern('rg.scoped-to-us', SEQUENCE_TRANSPORT_ID)
  scopedToUs() {
    count('scoped-to-us');
  }

  @EventPattern('rg.pair')
  first() {
    count('first');
  }

  @EventPattern('rg.pair')
  second() {
    if (count('second') < 2) throw new Error('once');
  }

  @MessagePattern('rg.bigint')
  bigint() {
    count('bigint');
    return { n: 1n };
  }

  @MessagePattern('rg.ask')
  ask(@Payload() data: unknown) {
    count('ask');
    return { secret: data };
  }

  @EventPattern('rg.victim')
  victim(@Payload() data: unknown) {
    count('victim');
    return data;
  }

  @EventPattern('rg.rpc-validated')
  rpcValidated(
    @Payload(
      new ValidationPipe({
        exceptionFactory: (errors) =>
          new RpcException(errors.flatMap((error) => Object.values(error.constraints ?? {}))),
      }),
    )
    note: Note,
  ) {
    count('rpc-validated');
    return note;
  }

  @EventPattern('rg.header-validated')
  headerValidated(@NoteHeader(new ValidationPipe({ validateCustomDecorators: true })) note: Note) {
    count('header-validated');
    return note;
  }

  @EventPattern('rg.named')
  @UseGuards(NamesTheHandler)
  named() {
    count('named');
  }

  @EventPattern('rg.ordered')
  ordered() {
    count('ordered');
  }

  @EventPattern('rg.ordered-own-dlq')
  orderedOwnDeadLetters() {
    count('ordered-own-dlq');
    throw new Error('refuses every event');
  }

  @EventPattern('rg.shared.a')
  sharedA() {
    count('shared-a');
  }

  @EventPattern('rg.kafka-only', NestTransport.KAFKA)
  kafkaOnly() {
    count('kafka-only');
  }
}

const channelOf = (pattern: string) => (pattern.startsWith('rg.shared.') ? 'rg.shared' : pattern);

describe('SequenceServer: what it refuses, retries and keeps apart', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 16 * 1024 },
        claimCheck: { inlineMaxBytes: 8 * 1024, sequenceMaxBytes: 1024 * 1024 },
        handlerRetry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 2 },
      },
      controllers: [Regressions],
      providers: [NamesTheHandler],
      server: {
        channelOf,
        channels: {
          'rg.ordered': { resequence: { gap: { timeoutMs: 60_000, policy: 'alert' } } },
          // The channel's options beside `resequence` apply to its resequencer.
          'rg.ordered-own-dlq': {
            // Left undefined inside, as a config may: the one beside it holds.
            resequence: {
              gap: { timeoutMs: 60_000, policy: 'alert' },
              deadLetterChannel: undefined,
            },
            deadLetterChannel: 'rg.ordered-own-dlq.custom',
            handlerRetry: { attempts: 1 },
          },
        },
      },
      client: { channelOf, replyTimeoutMs: 3_000 },
    });
  });

  afterAll(() => t?.close());

  beforeEach(resetCalls);

  const emit = (pattern: string, data: unknown) => emitVia(t, pattern, data);
  const reasons = (channel: string) => deathReasons(transport, channel);

  it('retries when an exception filter answers with an erroring Observable, then dead-letters', async () => {
    await emit('rg.filtered', { any: 1 });
    await transport.whenIdle();
    expect(calls.filtered).toBe(3);
    expect(reasons('rg.filtered')).toEqual([expect.stringMatching(/^handler-failed: .*E42/)]);
  });

  it('settles a message as handled when an exception filter answers with a value', async () => {
    await emit('rg.swallowed', {});
    await transport.whenIdle();
    expect(calls.swallowed).toBe(1);
    expect(reasons('rg.swallowed')).toEqual([]);
  });

  it('serves a handler scoped to SEQUENCE_TRANSPORT_ID', async () => {
    await emit('rg.scoped-to-us', {});
    await transport.whenIdle();
    expect(calls['scoped-to-us']).toBe(1);
  });

  it('serves a handler a controller inherits', async () => {
    await emit('rg.inherited', {});
    await transport.whenIdle();
    expect(calls.inherited).toBe(1);
  });

  it('does not run again a handler of the pattern that succeeded, when another is retried', async () => {
    await emit('rg.pair', {});
    await transport.whenIdle();
    expect(calls).toMatchObject({ first: 1, second: 2 });
  });

  it('answers an error when the reply cannot be encoded, and runs the handler once', async () => {
    await expect(lastValueFrom(t.client.send('rg.bigint', {}))).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/cannot be encoded/),
    });
    expect(calls.bigint).toBe(1);
  });

  it('refuses a request whose x-reply-to is not a reply channel, without running the handler', async () => {
    await transport.publish('rg.ask', Buffer.from('{"q":1}'), {
      'content-type': 'application/json',
      [RpcHeader.replyTo]: 'rg.victim',
      [RpcHeader.correlationId]: 'c-1',
    });
    await transport.whenIdle();
    expect(calls.ask).toBeUndefined();
    expect(calls.victim).toBeUndefined();
    expect(reasons('rg.ask')).toEqual([
      expect.stringMatching(/^undecodable: .*"rg\.victim" is not a reply channel/),
    ]);
  });

  it('refuses a request whose x-correlation-id is over 200 characters, without running the handler', async () => {
    // A server keeps the ids it answered: a sender must not make each of them megabytes.
    await transport.publish('rg.ask', Buffer.from('{"q":1}'), {
      'content-type': 'application/json',
      [RpcHeader.replyTo]: 'nseq.reply.00000000-0000-4000-8000-000000000000',
      [RpcHeader.correlationId]: 'c'.repeat(201),
    });
    await transport.whenIdle();
    expect(calls.ask).toBeUndefined();
    expect(reasons('rg.ask')).toEqual([
      expect.stringMatching(
        /^undecodable: .*x-correlation-id is not 1 to 200 .*\(201 characters\)/,
      ),
    ]);
  });

  it('dead-letters an emit() to a pattern only a @MessagePattern handles no-handler, unrun', async () => {
    // The payload is fine: what is missing is a handler for an event of the pattern.
    await emit('rg.ask', { q: 2 });
    await transport.whenIdle();
    expect(calls.ask).toBeUndefined();
    expect(reasons('rg.ask')).toEqual([
      expect.stringMatching(
        /^no-handler: .*only a request handler \(@MessagePattern Regressions\.ask\) handles pattern "rg\.ask".*SequenceClient\.send/,
      ),
    ]);
  });

  it('still dead-letters a request with only one of its reply headers undecodable', async () => {
    await transport.publish('rg.ask', Buffer.from('{"q":1}'), {
      'content-type': 'application/json',
      [RpcHeader.correlationId]: 'c-2',
    });
    await transport.whenIdle();
    expect(calls.ask).toBeUndefined();
    expect(reasons('rg.ask')).toEqual([
      expect.stringMatching(/^undecodable: .*a request for rg\.ask: it has no x-reply-to/),
    ]);
  });

  it('answers a request for a pattern nothing handles with the error, and dead-letters it', async () => {
    await expect(lastValueFrom(t.client.send('rg.shared.none', {}))).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^no-handler: .*"rg\.shared\.none"/),
    });
    await transport.whenIdle();
    expect(reasons('rg.shared')).toEqual([expect.stringMatching(/^no-handler: /)]);
  });

  it('takes a pipe’s RpcException as a refusal with its messages, not retried', async () => {
    await emit('rg.rpc-validated', { text: 7 });
    await transport.whenIdle();
    expect(calls['rpc-validated']).toBeUndefined();
    expect(reasons('rg.rpc-validated')).toEqual([
      expect.stringMatching(/^invalid-payload: .*text must be a string/),
    ]);
  });

  it('takes a refusal of a pipe on a custom parameter decorator as invalid-payload', async () => {
    await emit(
      'rg.header-validated',
      new SequenceRecord({}, { headers: { 'x-note': '{"text":3}' } }),
    );
    await transport.whenIdle();
    expect(calls['header-validated']).toBeUndefined();
    expect(reasons('rg.header-validated')).toEqual([
      expect.stringMatching(/^invalid-payload: .*text must be a string/),
    ]);
  });

  it('does not run again a succeeded handler when a Message Sequence is retried', async () => {
    await emit('rg.pair', Buffer.alloc(40 * 1024, 7));
    await transport.whenIdle();
    expect(calls).toMatchObject({ first: 1, second: 2 });
  });

  it('keeps the method’s name on the handler guards and interceptors see', async () => {
    await emit('rg.named', {});
    await transport.whenIdle();
    expect(handlerName).toBe('named');
  });

  it('dead-letters a resequenced event sent as a Message Sequence, rather than handle a fragment', async () => {
    await emit(
      'rg.ordered',
      new SequenceRecord(Buffer.alloc(40 * 1024, 1), {
        headers: { 'x-resequence-key': 'k', 'x-resequence-seq': 1 },
      }),
    );
    await transport.whenIdle();
    expect(calls.ordered).toBeUndefined();
    expect(reasons('rg.ordered')[0]).toMatch(
      /^invalid-resequence-event: the message is a fragment of a Message Sequence/,
    );
  });

  it("applies a resequenced channel's options given beside resequence: its dead letters go where they say", async () => {
    await emit(
      'rg.ordered-own-dlq',
      new SequenceRecord({ n: 1 }, { headers: { 'x-resequence-key': 'k', 'x-resequence-seq': 1 } }),
    );
    await transport.whenIdle();
    expect(calls['ordered-own-dlq']).toBe(1); // handlerRetry: one attempt
    expect(
      transport.take('rg.ordered-own-dlq.custom').map((m) => m.headers['x-death-reason']),
    ).toEqual([expect.stringMatching(/^handler-failed: .*refuses every event/)]);
    expect(reasons('rg.ordered-own-dlq')).toEqual([]);
  });

  it('leaves handlers scoped to another transport alone', async () => {
    expect(transport.depth('rg.kafka-only')).toBe(0);
    await transport.publish('rg.kafka-only', Buffer.from('{}'), {
      'content-type': 'application/json',
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(calls['kafka-only']).toBeUndefined();
    expect(transport.depth('rg.kafka-only')).toBe(1);
  });
});

@Controller({ scope: Scope.REQUEST })
class PerRequest {
  @EventPattern('rg.scoped')
  take() {}
}

/** Refuses the first subscribe, as a broker briefly unreachable would. */
class RefusesOnce extends ForwardingTransport {
  readonly name = 'refuses-once';
  refused = false;
  override subscribe(
    channel: string,
    handler: MessageHandler,
    options?: SubscribeOptions,
  ): Promise<Subscription> {
    if (!this.refused) {
      this.refused = true;
      return Promise.reject(new Error('broker said no'));
    }
    return super.subscribe(channel, handler, options);
  }
}

@Controller()
class Plain {
  @EventPattern('rg.plain')
  take() {
    count('plain');
  }
}

describe('SequenceServer.listen', () => {
  it('refuses a request-scoped controller, naming it', async () => {
    await expect(
      createMicroserviceTestApp({
        sequence: { transport: new InMemoryTransport() },
        controllers: [PerRequest],
      }),
    ).rejects.toThrow(/PerRequest\.take .*request-scoped or transient/);
  });

  it('can listen again after a subscription failed, on a resequenced channel too', async () => {
    const inner = new InMemoryTransport();
    const transport = new RefusesOnce(inner);
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({ transport }),
        ClientsModule.register([{ name: 'C', customClass: SequenceClient }]),
      ],
      controllers: [Plain],
    }).compile();
    const app = moduleRef.createNestMicroservice({
      strategy: new SequenceServer({
        channels: { 'rg.plain': { resequence: { gap: { timeoutMs: 60_000, policy: 'alert' } } } },
      }),
      logger: false,
    });
    // The app boots (no decorated handler to subscribe); listen() then fails once.
    await expect(app.listen()).rejects.toThrow(/broker said no/);
    await app.listen();
    const t = { client: app.get<SequenceClient>('C'), close: () => app.close() };
    try {
      await lastValueFrom(
        t.client.emit(
          'rg.plain',
          new SequenceRecord({}, { headers: { 'x-resequence-key': 'k', 'x-resequence-seq': 1 } }),
        ),
        { defaultValue: undefined },
      );
      await inner.whenIdle();
      expect(calls.plain).toBe(1);
    } finally {
      await t.close();
      await inner.close();
    }
  });

  it("says so when it listens after the module's shutdown began: its handlers consume nothing", async () => {
    const transport = new InMemoryTransport();
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport })],
      controllers: [Plain],
    }).compile();
    const server = new SequenceServer();
    const app = moduleRef.createNestMicroservice({ strategy: server, logger: false });
    await app.init();
    await app.close();
    const warnings: string[] = [];
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => {
      warnings.push(String(message));
    });
    try {
      // It calls back without an error: the application is stopping, not failing.
      expect(await new Promise<unknown>((resolve) => server.listen(resolve))).toBeUndefined();
      // Its latest status: nothing consumes.
      await expect(firstValueFrom(server.status.pipe(timeout(1_000)))).resolves.toBe(
        'disconnected',
      );

      expect(warnings).toEqual([
        expect.stringMatching(
          /SequenceServer listened after SequenceModule's shutdown began: its handlers are not subscribed \(Plain\.take on rg\.plain\)/,
        ),
      ]);
      // Nothing consumes the channel: what is published there stays queued.
      await transport.publish('rg.plain', Buffer.from('{}'), {});
      await transport.whenIdle();
      expect(transport.depth('rg.plain')).toBe(1);
    } finally {
      warn.mockRestore();
      await transport.close();
    }
  });
});

/** Nest's catch-all RPC filter, counting the exceptions it sees. */
@Catch()
class CountingCatchAll extends BaseRpcExceptionFilter {
  override catch(exception: unknown, host: ArgumentsHost): Observable<unknown> {
    count('catch-all');
    return super.catch(exception, host);
  }
}

/** A catch-all filter bound to a method or a class: any exception becomes a plain object. */
@Catch()
class Opaque implements RpcExceptionFilter {
  catch(): Observable<never> {
    count('opaque');
    return throwError(() => ({ status: 'error', message: 'Internal server error' }));
  }
}

@Injectable()
class Refuses implements CanActivate {
  canActivate(): boolean {
    count('refuses');
    return false;
  }
}

@Controller()
class UnderCatchAll {
  @EventPattern('ca.validated')
  @UsePipes(new ValidationPipe())
  validated(@Payload() note: Note) {
    count('validated');
    return note;
  }

  @EventPattern('ca.guarded')
  @UseGuards(Refuses)
  guarded() {
    count('guarded');
  }

  @MessagePattern('ca.guarded-request')
  @UseGuards(Refuses)
  guardedRequest() {
    count('guarded-request');
  }

  @EventPattern('ca.guarded-opaque')
  @UseGuards(Refuses)
  @UseFilters(Opaque)
  guardedOpaque() {
    count('guarded-opaque');
  }

  @EventPattern('ca.refusing')
  refusing() {
    count('refusing');
    throw new MessageRefusedError('invalid-payload', 'no such study');
  }

  @EventPattern('ca.failing')
  failing() {
    count('failing');
    throw new Error('the archive is gone');
  }

  @MessagePattern('ca.failing-request')
  failingRequest() {
    throw new Error('the archive is gone');
  }
}

@Controller()
@UseFilters(Opaque)
class OpaqueClass {
  @EventPattern('ca.class-validated')
  @UsePipes(new ValidationPipe())
  validated(@Payload() note: Note) {
    count('class-validated');
    return note;
  }
}

describe('SequenceServer under a catch-all exception filter', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 2 } },
      controllers: [UnderCatchAll, OpaqueClass],
      providers: [Refuses],
      client: { replyTimeoutMs: 3_000 },
      // BaseRpcExceptionFilter logs the errors it does not know.
      logger: false,
      configure: (app) => app.useGlobalFilters(new CountingCatchAll()),
    });
  });

  afterAll(() => t?.close());

  beforeEach(resetCalls);

  const emit = (pattern: string, data: unknown) => emitVia(t, pattern, data);
  const reasons = (channel: string) => deathReasons(transport, channel);

  it('dead-letters a ValidationPipe refusal invalid-payload, once, after the filter saw it', async () => {
    await emit('ca.validated', { text: 7 });
    await transport.whenIdle();
    expect(calls).toEqual({ 'catch-all': 1 });
    expect(reasons('ca.validated')).toEqual([
      expect.stringMatching(/^invalid-payload: .*text must be a string/),
    ]);
  });

  it('dead-letters a guard refusal forbidden, once, after the filter saw it', async () => {
    await emit('ca.guarded', {});
    await transport.whenIdle();
    expect(calls).toEqual({ refuses: 1, 'catch-all': 1 });
    expect(reasons('ca.guarded')).toEqual([expect.stringMatching(/^forbidden: /)]);
  });

  it('answers a request a guard refuses with forbidden', async () => {
    await expect(lastValueFrom(t.client.send('ca.guarded-request', {}))).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/^forbidden: /),
    });
    expect(calls).toEqual({ refuses: 1, 'catch-all': 1 });
  });

  it('classifies by the exception a method-level or class-level catch-all filter replaced', async () => {
    await emit('ca.guarded-opaque', {});
    await emit('ca.class-validated', { text: 7 });
    await transport.whenIdle();
    expect(calls).toEqual({ refuses: 1, opaque: 2 });
    expect(reasons('ca.guarded-opaque')).toEqual([expect.stringMatching(/^forbidden: /)]);
    expect(reasons('ca.class-validated')).toEqual([
      expect.stringMatching(/^invalid-payload: .*text must be a string/),
    ]);
  });

  it('dead-letters a MessageRefusedError with its code, not retried', async () => {
    await emit('ca.refusing', {});
    await transport.whenIdle();
    expect(calls).toEqual({ refusing: 1, 'catch-all': 1 });
    expect(reasons('ca.refusing')).toEqual([
      expect.stringMatching(/^invalid-payload: .*no such study/),
    ]);
  });

  it('answers a failed request with the object the filter answered, as Nest does', async () => {
    await expect(lastValueFrom(t.client.send('ca.failing-request', {}))).rejects.toEqual({
      status: 'error',
      message: 'Internal server error',
    });
  });

  it('retries a handler’s error, then dead-letters it with what the filter answered', async () => {
    await emit('ca.failing', {});
    await transport.whenIdle();
    expect(calls).toEqual({ failing: 3, 'catch-all': 3 });
    expect(reasons('ca.failing')).toEqual([
      expect.stringMatching(/^handler-failed: .*Internal server error/),
    ]);
  });
});
