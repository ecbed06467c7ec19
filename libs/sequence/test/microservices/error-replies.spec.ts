import { Catch, Controller, UseFilters, type RpcExceptionFilter } from '@nestjs/common';
import { MessagePattern, RpcException } from '@nestjs/microservices';
import { lastValueFrom, throwError, type Observable } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { MessageRefusedError } from 'nest-sequence/microservices';
import { useFaultyStoreApp } from './faulty-store-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

/** A filter that answers every exception with an error code of its own, as an object. */
@Catch()
class AsErrorCode implements RpcExceptionFilter {
  catch(): Observable<never> {
    return throwError(() => ({ code: 'E_QUOTE', retryable: true }));
  }
}

/** A detail long enough to make the error body travel as a Message Sequence. */
const LONG_DETAIL = 'x'.repeat(20 * 1024);

@Controller()
class Quotes {
  @MessagePattern('er.not-found')
  notFound() {
    throw new RpcException({ statusCode: 404, message: 'no such quote' });
  }

  @MessagePattern('er.text')
  text() {
    throw new RpcException('quote service down');
  }

  @MessagePattern('er.list')
  list() {
    throw new RpcException(['sku is required', 'qty must be positive']);
  }

  @MessagePattern('er.filtered')
  @UseFilters(AsErrorCode)
  filtered() {
    throw new Error('the database is down');
  }

  @MessagePattern('er.plain')
  plain() {
    throw new Error('the archive is gone');
  }

  @MessagePattern('er.inner-error')
  innerError() {
    // An Error as JSON is {}: its message is what tells the caller anything.
    throw new RpcException(new Error('the archive is read-only'));
  }

  @MessagePattern('er.thrown-object')
  thrownObject() {
    // eslint-disable-next-line @typescript-eslint/only-throw-error -- what some code throws
    throw { code: 'E_RAW' };
  }

  @MessagePattern('er.long')
  long() {
    throw new RpcException({ code: 'E_LONG', detail: LONG_DETAIL });
  }

  @MessagePattern('er.huge')
  huge() {
    throw new RpcException({ code: 'E_HUGE', detail: 'x'.repeat(64 * 1024) });
  }

  @MessagePattern('er.map')
  map() {
    throw new RpcException({ totals: new Map([['a', 1]]) });
  }

  @MessagePattern('er.cycle')
  cycle() {
    const error: Record<string, unknown> = { code: 'E_CYCLE' };
    error.self = error;
    throw new RpcException(error);
  }
}

describe('request-reply: the error send() errors with, as Nest gives it', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 16 * 1024 },
        claimCheck: { inlineMaxBytes: 8 * 1024, sequenceMaxBytes: 1024 * 1024 },
      },
      controllers: [Quotes],
      client: { replyTimeoutMs: 2_000, maxJsonBytes: 32 * 1024 },
    });
  });

  afterAll(() => t?.close());

  const failure = (pattern: string) =>
    lastValueFrom(t.client.send(pattern, {})).then(
      () => {
        throw new Error(`${pattern} answered`);
      },
      (error: unknown) => error,
    );

  it('errors with an RpcException’s object error, as it is', async () => {
    expect(await failure('er.not-found')).toEqual({ statusCode: 404, message: 'no such quote' });
  });

  it('errors with an RpcException’s array error, as it is', async () => {
    expect(await failure('er.list')).toEqual(['sku is required', 'qty must be positive']);
  });

  it('errors with { status, message } for an RpcException’s text', async () => {
    expect(await failure('er.text')).toEqual({ status: 'error', message: 'quote service down' });
  });

  it('errors with the object an exception filter errors with, as it is', async () => {
    expect(await failure('er.filtered')).toEqual({ code: 'E_QUOTE', retryable: true });
  });

  it('errors with { status, message } and its message for a plain Error', async () => {
    expect(await failure('er.plain')).toEqual({ status: 'error', message: 'the archive is gone' });
  });

  it('errors with { status, message } for an RpcException whose error is an Error', async () => {
    expect(await failure('er.inner-error')).toEqual({
      status: 'error',
      message: 'the archive is read-only',
    });
  });

  it('errors with a thrown object as it is', async () => {
    expect(await failure('er.thrown-object')).toEqual({ code: 'E_RAW' });
  });

  it('sends an error object too large for one message as a Message Sequence', async () => {
    const errors = jest.spyOn(transport, 'publish');
    try {
      const error = (await failure('er.long')) as { detail?: unknown };
      // Compared as a flag: a failure's diff would print the whole detail.
      expect({ ...error, detail: error.detail === LONG_DETAIL }).toEqual({
        code: 'E_LONG',
        detail: true,
      });
      const replies = errors.mock.calls.filter(([channel]) => transport.isReplyChannel(channel));
      expect(replies.length).toBeGreaterThan(1); // its fragments
    } finally {
      errors.mockRestore();
    }
  });

  it('errors as undecodable when the error is larger than the client’s maxJsonBytes', async () => {
    // The body is JSON, whatever the error: the client's limit on JSON holds for it.
    const error = await failure('er.huge');
    expect(error).toBeInstanceOf(MessageRefusedError);
    expect(error).toMatchObject({ code: 'undecodable' });
  });

  it.each([
    ['holds a Map', 'er.map', /^the reply cannot be encoded: the property "totals" is a Map/],
    ['is a cycle', 'er.cycle', /^the reply cannot be encoded: .*circular/i],
  ])('errors saying so when the error %s, which JSON cannot carry', async (_what, pattern, why) => {
    expect(await failure(pattern)).toEqual({
      status: 'error',
      message: expect.stringMatching(why),
    });
  });
});

describe('request-reply: an error body that cannot be sent', () => {
  const fx = useFaultyStoreApp('ms-error-replies-', ({ transport, store }) => ({
    sequence: {
      transport,
      claimCheck: { store, inlineMaxBytes: 1024, sequenceMaxBytes: 2048 },
      handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 },
    },
    controllers: [Quotes],
    client: { replyTimeoutMs: 3_000 },
  }));

  it('errors at once, saying why, when the store refuses an error body sent behind a ticket', async () => {
    fx.store.failPuts = 1;
    const asked = Date.now();
    await expect(lastValueFrom(fx.app.client.send('er.long', {}))).rejects.toEqual({
      status: 'error',
      message: expect.stringMatching(/^the reply could not be sent: /),
    });
    expect(Date.now() - asked).toBeLessThan(2_000); // not at replyTimeoutMs
    expect(fx.store.failPuts).toBe(0);
  });
});
