import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import {
  Controller,
  HttpException,
  HttpStatus,
  Injectable,
  ServiceUnavailableException,
  UseGuards,
  UseInterceptors,
  UsePipes,
  ValidationPipe,
  type CallHandler,
  type CanActivate,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { Ctx, EventPattern, Payload, RpcException } from '@nestjs/microservices';
import { IsInt, IsString, Min } from 'class-validator';
import { EMPTY, ignoreElements, lastValueFrom, tap, throwError } from 'rxjs';
import { InMemoryTransport, type InboundMessage } from 'nest-sequence';
import { RpcHeader, SequenceRecord, type SequenceContext } from 'nest-sequence/microservices';
import { eventually } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

class StudyDto {
  @IsString() studyId!: string;
  @IsInt() @Min(1) series!: number;
}

interface Seen {
  pattern: string;
  data: unknown;
  via: string;
  fragments: number;
  sequenceId?: string;
  headers: Record<string, unknown>;
  message?: InboundMessage;
}

const seen: Seen[] = [];
const calls: Record<string, number> = {};
const around: string[] = [];
/** The streams `ms.returns-stream` returned. */
const opened: Readable[] = [];
const count = (name: string) => (calls[name] = (calls[name] ?? 0) + 1);

function record(data: unknown, ctx: SequenceContext): void {
  seen.push({
    pattern: ctx.getPattern(),
    data,
    via: ctx.getVia(),
    fragments: ctx.getFragments(),
    sequenceId: ctx.getSequenceId(),
    headers: { ...ctx.getHeaders() },
    message: ctx.getMessage(),
  });
}

@Injectable()
class RefuseAll implements CanActivate {
  canActivate(): boolean {
    return false;
  }
}

/** Refuses as Nest's microservices docs show: with an RpcException. */
@Injectable()
class RefuseWithRpcException implements CanActivate {
  canActivate(): boolean {
    count('rpc-guard');
    throw new RpcException('no such tenant');
  }
}

/** Fails for passing reasons (an auth service away, a rate limit), once each; then passes. */
@Injectable()
class FailsThenPasses implements CanActivate {
  canActivate(): boolean {
    const call = count('lookup');
    if (call === 1) throw new ServiceUnavailableException('auth service unavailable');
    if (call === 2) throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
    return true;
  }
}

@Injectable()
class Around implements NestInterceptor {
  intercept(context: ExecutionContext, next: CallHandler) {
    around.push(`before ${context.getType()}`);
    return next.handle().pipe(tap(() => around.push('after')));
  }
}

/** Lets the work run and emits nothing, as a fire-and-forget audit interceptor does. */
@Injectable()
class Quiet implements NestInterceptor {
  intercept(_context: ExecutionContext, next: CallHandler) {
    return next.handle().pipe(ignoreElements());
  }
}

@Controller()
class StudyController {
  @EventPattern('ms.any')
  async any(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    record(Buffer.isBuffer(data) || typeof data !== 'object' ? data : data, ctx);
  }

  @EventPattern('ms.stream')
  async stream(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    const isStream = data instanceof Readable;
    const chunks: Buffer[] = [];
    if (isStream) for await (const chunk of data) chunks.push(chunk as Buffer);
    record(
      { isStream, sha256: createHash('sha256').update(Buffer.concat(chunks)).digest('hex') },
      ctx,
    );
  }

  @EventPattern('ms.validated')
  @UsePipes(new ValidationPipe())
  validated(@Payload() study: StudyDto, @Ctx() ctx: SequenceContext) {
    count('validated');
    record(study, ctx);
  }

  @EventPattern('ms.guarded')
  @UseGuards(RefuseAll)
  guarded() {
    count('guarded');
  }

  @EventPattern('ms.rpc-guarded')
  @UseGuards(RefuseWithRpcException)
  rpcGuarded() {
    count('rpc-guarded');
  }

  @EventPattern('ms.lookup-guarded')
  @UseGuards(FailsThenPasses)
  lookupGuarded(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    record(data, ctx);
  }

  @EventPattern('ms.intercepted')
  @UseInterceptors(Around)
  intercepted(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    around.push('handler');
    record(data, ctx);
  }

  @EventPattern('ms.failing')
  failing() {
    count('failing');
    throw new RpcException('the archive is read-only');
  }

  @EventPattern('ms.doomed')
  doomed() {
    throw new Error('the archive is gone');
  }

  @EventPattern('ms.doomed.dlq')
  doomedDeadLetters(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    record({ data, reason: ctx.getDeadLetterReason() }, ctx);
  }

  @EventPattern('ms.flaky')
  flaky(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    if (count('flaky') < 2) throw new Error('not yet');
    record(data, ctx);
  }

  @EventPattern('ms.thrown-text')
  thrownText() {
    // eslint-disable-next-line @typescript-eslint/only-throw-error -- what some code throws
    throw 'inventory service down';
  }

  @EventPattern('ms.erroring-text')
  erroringText() {
    return throwError(() => 'inventory service down');
  }

  @EventPattern('ms.empty')
  empty(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    count('empty');
    record(data, ctx);
    // Work done, nothing to emit (a save$().pipe(ignoreElements()), say).
    return EMPTY;
  }

  @EventPattern('ms.quiet')
  @UseInterceptors(Quiet)
  quiet(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    count('quiet');
    record(data, ctx);
    return 'saved';
  }

  @EventPattern('ms.shared.a')
  sharedA(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    record(data, ctx);
  }

  /** Returns what it opened, a socket say (a stream that never ends), or a record of it. */
  @EventPattern('ms.returns-stream')
  returnsStream(@Payload() data: { wrapped?: boolean }) {
    const socket = new Readable({ read() {} });
    socket.push(Buffer.from('vitals'));
    opened.push(socket);
    return data.wrapped ? new SequenceRecord(socket, { contentType: 'text/plain' }) : socket;
  }

  @EventPattern('ms.ordered')
  ordered(@Payload() data: unknown, @Ctx() ctx: SequenceContext) {
    record({ data, key: ctx.getKey(), seq: ctx.getSeq() }, ctx);
  }
}

const sha = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');

describe('SequenceServer: @EventPattern handlers through Nest’s pipeline (embedded transport)', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 64 * 1024 },
        claimCheck: { inlineMaxBytes: 16 * 1024, sequenceMaxBytes: 1024 * 1024 },
        handlerRetry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 5 },
      },
      controllers: [StudyController],
      providers: [RefuseAll, RefuseWithRpcException, FailsThenPasses, Around, Quiet],
      server: {
        streamAboveBytes: 512 * 1024,
        channelOf: (pattern) => (pattern.startsWith('ms.shared.') ? 'ms.shared' : pattern),
        channels: {
          'ms.ordered': { resequence: { gap: { timeoutMs: 60_000, policy: 'alert' } } },
        },
      },
      client: {
        channelOf: (pattern) => (pattern.startsWith('ms.shared.') ? 'ms.shared' : pattern),
      },
    });
  });

  afterAll(() => t?.close());

  beforeEach(() => {
    seen.length = 0;
    around.length = 0;
    for (const key of Object.keys(calls)) delete calls[key];
  });

  const emit = (pattern: string, data: unknown) =>
    lastValueFrom(t.client.emit(pattern, data), { defaultValue: undefined });
  const deadLetters = (channel: string) => transport.take(transport.deadLetterChannel(channel));

  it('destroys a stream an @EventPattern handler returns, a SequenceRecord’s too: none is sent', async () => {
    opened.length = 0;
    await emit('ms.returns-stream', {});
    await emit('ms.returns-stream', { wrapped: true });
    // A request to the pattern: no @MessagePattern answers it, so its result is not sent either.
    await expect(lastValueFrom(t.client.send('ms.returns-stream', {}))).rejects.toMatchObject({
      message: expect.stringMatching(/^no-handler: /),
    });
    await transport.whenIdle();
    expect(opened.map((stream) => stream.destroyed)).toEqual([true, true, true]);
    expect(deadLetters('ms.returns-stream')).toEqual([]);
  });

  it('hands a JSON object over as an object, with the ids and headers in @Ctx()', async () => {
    await emit('ms.any', new SequenceRecord({ study: 'CT-1' }, { headers: { 'x-study': 'CT-1' } }));
    await transport.whenIdle();
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({
      pattern: 'ms.any',
      data: { study: 'CT-1' },
      via: 'inline',
      fragments: 1,
      headers: { 'x-study': 'CT-1', [RpcHeader.pattern]: 'ms.any' },
    });
    expect(seen[0].message?.channel).toBe('ms.any');
  });

  it('sends a string of a content type other than JSON as its UTF-8 bytes, as they are', async () => {
    const csv = 'id,qty\n1,2\n';
    await emit('ms.any', new SequenceRecord(csv, { contentType: 'text/csv; charset=utf-8' }));
    await transport.whenIdle();
    expect(seen).toHaveLength(1);
    expect(Buffer.isBuffer(seen[0].data)).toBe(true);
    expect((seen[0].data as Buffer).toString('utf8')).toBe(csv);

    // Anything else under such a label would be sent wrong: refused, nothing sent.
    await expect(
      emit('ms.any', new SequenceRecord({ id: 1 }, { contentType: 'text/csv' })),
    ).rejects.toThrow(/content type text\/csv holds an object/);
    await transport.whenIdle();
    expect(seen).toHaveLength(1);
  });

  it('reassembles a Message Sequence and hands over the verified bytes as a Buffer', async () => {
    const bytes = randomBytes(300 * 1024);
    await emit('ms.any', bytes);
    await transport.whenIdle();
    expect(seen).toHaveLength(1);
    expect(seen[0].via).toBe('sequence');
    expect(seen[0].fragments).toBeGreaterThan(1);
    expect(seen[0].sequenceId).toEqual(expect.any(String));
    expect(Buffer.isBuffer(seen[0].data)).toBe(true);
    expect(sha(seen[0].data as Buffer)).toBe(sha(bytes));
  });

  it('resolves a claim-checked payload and hands a large one over as a stream', async () => {
    const bytes = randomBytes(2 * 1024 * 1024);
    await emit('ms.stream', new SequenceRecord(Readable.from([bytes]), { bytes: bytes.length }));
    await transport.whenIdle();
    expect(seen).toHaveLength(1);
    expect(seen[0].via).toBe('ticket');
    expect(seen[0].data).toEqual({ isStream: true, sha256: sha(bytes) });
  });

  it('runs a ValidationPipe: a valid DTO is handled', async () => {
    await emit('ms.validated', { studyId: 'CT-2', series: 3 });
    await transport.whenIdle();
    expect(seen.map((s) => s.data)).toEqual([{ studyId: 'CT-2', series: 3 }]);
  });

  it('dead-letters an invalid payload with the validation messages, without a retry', async () => {
    await emit('ms.validated', { studyId: 7, series: 0 });
    await transport.whenIdle();
    expect(calls.validated).toBeUndefined();
    const [dead, ...more] = deadLetters('ms.validated');
    expect(more).toHaveLength(0);
    const reason = String(dead.headers['x-death-reason']);
    expect(reason).toMatch(/^invalid-payload: /);
    expect(reason).toContain('studyId must be a string');
    expect(reason).toContain('series must not be less than 1');
  });

  it('dead-letters a message a guard refuses as forbidden, without calling the handler', async () => {
    await emit('ms.guarded', { any: 1 });
    await transport.whenIdle();
    expect(calls.guarded).toBeUndefined();
    const [dead] = deadLetters('ms.guarded');
    expect(String(dead.headers['x-death-reason'])).toMatch(/^forbidden: /);
  });

  it('dead-letters a message a guard refuses with an RpcException as forbidden, not retried', async () => {
    await emit('ms.rpc-guarded', { any: 1 });
    await transport.whenIdle();
    expect({ guard: calls['rpc-guard'], handler: calls['rpc-guarded'] }).toEqual({
      guard: 1,
      handler: undefined,
    });
    expect(deadLetters('ms.rpc-guarded').map((m) => m.headers['x-death-reason'])).toEqual([
      expect.stringMatching(/^forbidden: .*a guard refused the message: no such tenant$/),
    ]);
  });

  it('retries a message whose guard failed otherwise (a 503, a 429) until it passes', async () => {
    await emit('ms.lookup-guarded', { n: 2 });
    await transport.whenIdle();
    expect(calls.lookup).toBe(3);
    expect(seen.map((s) => s.data)).toEqual([{ n: 2 }]);
    expect(deadLetters('ms.lookup-guarded')).toHaveLength(0);
  });

  it('runs interceptors around the handler', async () => {
    await emit('ms.intercepted', { any: 1 });
    await transport.whenIdle();
    expect(around).toEqual(['before rpc', 'handler', 'after']);
  });

  it('retries an RpcException per handlerRetry, then dead-letters it with its message', async () => {
    await emit('ms.failing', { any: 1 });
    await transport.whenIdle();
    expect(calls.failing).toBe(3);
    const [dead] = deadLetters('ms.failing');
    const reason = String(dead.headers['x-death-reason']);
    expect(reason).toMatch(/^handler-failed: /);
    expect(reason).toContain('the archive is read-only');
  });

  it('hands a dead letter to the handler of the dead-letter channel, with its reason', async () => {
    await emit('ms.doomed', { order: 'o-1' });
    await eventually(() => seen.length === 1, 'the dead letter handled');
    expect(seen[0]).toMatchObject({
      pattern: 'ms.doomed.dlq',
      data: {
        data: { order: 'o-1' },
        reason: expect.stringMatching(/^handler-failed: .*the archive is gone/),
      },
    });
    expect(deadLetters('ms.doomed.dlq')).toHaveLength(0);
  });

  it('dead-letters a thrown text with that text, unquoted, as the last error', async () => {
    await emit('ms.thrown-text', { any: 1 });
    await emit('ms.erroring-text', { any: 1 });
    await transport.whenIdle();
    const reasons = ['ms.thrown-text', 'ms.erroring-text'].flatMap((channel) =>
      deadLetters(channel).map((message) => String(message.headers['x-death-reason'])),
    );
    expect(reasons).toEqual([
      expect.stringMatching(/last error: inventory service down$/),
      expect.stringMatching(/last error: inventory service down$/),
    ]);
  });

  it('retries a thrown error and handles the message once it succeeds', async () => {
    await emit('ms.flaky', { n: 1 });
    await transport.whenIdle();
    expect(calls.flaky).toBe(2);
    expect(seen.map((s) => s.data)).toEqual([{ n: 1 }]);
    expect(deadLetters('ms.flaky')).toHaveLength(0);
  });

  it('acks a message whose handler returns an Observable that completes without a value', async () => {
    await emit('ms.empty', { order: 'o-2' });
    await transport.whenIdle();
    expect(calls.empty).toBe(1);
    expect(seen.map((s) => s.data)).toEqual([{ order: 'o-2' }]);
    expect(deadLetters('ms.empty')).toHaveLength(0);
  });

  it('acks a message whose interceptor turns the result into an empty Observable', async () => {
    await emit('ms.quiet', { order: 'o-3' });
    await transport.whenIdle();
    expect(calls.quiet).toBe(1);
    expect(deadLetters('ms.quiet')).toHaveLength(0);
  });

  it('dead-letters a message whose pattern nothing handles as no-handler', async () => {
    await emit('ms.shared.a', { to: 'a' });
    await emit('ms.shared.zzz', { to: 'nobody' });
    await transport.whenIdle();
    expect(seen.map((s) => s.data)).toEqual([{ to: 'a' }]);
    const [dead, ...more] = deadLetters('ms.shared');
    expect(more).toHaveLength(0);
    expect(String(dead.headers['x-death-reason'])).toMatch(
      /^no-handler: .*"ms\.shared\.zzz" on channel ms\.shared/,
    );
  });

  it('dead-letters a payload that cannot be decoded as undecodable, and goes on', async () => {
    await transport.publish('ms.any', Buffer.from('{"not json'), {
      'content-type': 'application/json',
    });
    await emit('ms.any', { after: true });
    await transport.whenIdle();
    expect(seen.map((s) => s.data)).toEqual([{ after: true }]);
    const [dead] = deadLetters('ms.any');
    expect(String(dead.headers['x-death-reason'])).toMatch(/^undecodable: /);
  });

  it('delivers each key’s events in order on a channel configured to resequence', async () => {
    for (const seq of [3, 1, 2]) {
      await emit(
        'ms.ordered',
        new SequenceRecord(
          { seq },
          { headers: { 'x-resequence-key': 'patient-9', 'x-resequence-seq': seq } },
        ),
      );
    }
    await transport.whenIdle();
    expect(seen.map((s) => s.data)).toEqual(
      [1, 2, 3].map((seq) => ({ data: { seq }, key: 'patient-9', seq })),
    );
  });
});
