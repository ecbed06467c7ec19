import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

const received: unknown[] = [];

@Controller()
class Pages {
  @EventPattern('shapes.in')
  page(@Payload() data: unknown) {
    received.push(data);
  }

  @MessagePattern('shapes.query')
  query() {
    // The usual shape of a paged query's result.
    return { records: [{ id: 1 }, { id: 2 }], total: 2 };
  }

  @MessagePattern('shapes.totals')
  totals() {
    return { totals: new Map([['a', 1]]) };
  }

  @MessagePattern('shapes.samples')
  samples() {
    return new Float32Array([1.5, -2]);
  }

  @MessagePattern('shapes.sku')
  sku(@Payload('sku') sku: unknown) {
    // Its type said apart: JSON would drop an undefined property.
    return { type: typeof sku, sku: sku ?? null };
  }
}

/** What `emit` and a reply take for records, and what they send as JSON. */
describe('SequenceClient payloads with a records property', () => {
  let transport: InMemoryTransport;
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: { transport, handlerRetry: { attempts: 1, baseDelayMs: 1, maxDelayMs: 1 } },
      controllers: [Pages],
      client: { replyTimeoutMs: 2_000 },
    });
  });

  afterAll(() => t?.close());

  beforeEach(() => {
    received.length = 0;
  });

  async function emitted(data: unknown): Promise<unknown> {
    await lastValueFrom(t.client.emit('shapes.in', data), { defaultValue: undefined });
    await transport.whenIdle();
    expect(received).toHaveLength(1);
    return received[0];
  }

  it.each([
    ['a page of objects with its total', { records: [{ id: 1 }, { id: 2 }], total: 2 }],
    ['an empty page with its number', { records: [], page: 3 }],
    ['an empty records array alone', { records: [] }],
    ['records of objects alone', { records: [{ id: 1 }] }],
  ])('sends %s as JSON, received as the same object', async (_what, page) => {
    expect(await emitted(page)).toEqual(page);
  });

  it('sends { records } of byte chunks as their bytes, one after the other', async () => {
    const body = await emitted({ records: [Buffer.from('ab'), Buffer.from('cd')] });
    expect(Buffer.isBuffer(body) && body.toString()).toBe('abcd');
  });

  it('sends { records } of a generator of byte chunks as their bytes', async () => {
    function* chunks() {
      yield Buffer.from('one,');
      yield Buffer.from('two');
    }
    const body = await emitted({ records: chunks() });
    expect(Buffer.isBuffer(body) && body.toString()).toBe('one,two');
  });

  it('sends { records } of a Set of byte chunks as their bytes', async () => {
    const body = await emitted({ records: new Set([Buffer.from('a'), Buffer.from('b')]) });
    expect(Buffer.isBuffer(body) && body.toString()).toBe('ab');
  });

  it('sends an instance of a class whose records are a getter as their bytes', async () => {
    class Export {
      readonly name = 'export-7';
      readonly rows = 2;
      get records() {
        return [Buffer.from('x,'), Buffer.from('y')];
      }
    }
    const body = await emitted(new Export());
    expect(Buffer.isBuffer(body) && body.toString()).toBe('x,y');
  });

  it('sends { records: <a Buffer> } as JSON: a Buffer holds bytes, not chunks', async () => {
    expect(await emitted({ records: Buffer.from('ab') })).toEqual({
      records: { type: 'Buffer', data: [97, 98] },
    });
  });

  it.each([
    ['an ArrayBuffer', () => new Uint8Array([1, 2, 3]).buffer],
    ['a Uint16Array', () => new Uint16Array([0x0201, 0x0403]).subarray(0, 2)],
    [
      'a DataView over part of its buffer',
      () => new DataView(new Uint8Array([9, 1, 2, 9]).buffer, 1, 2),
    ],
    ['a Uint8Array', () => new Uint8Array([5, 6])],
  ])('sends %s as binary bytes, not as JSON', async (_what, data) => {
    const value = data();
    const view = ArrayBuffer.isView(value)
      ? Buffer.from(value.buffer, value.byteOffset, value.byteLength)
      : Buffer.from(value);
    const body = await emitted(value);
    expect(Buffer.isBuffer(body) && [...body]).toEqual([...view]);
  });

  it.each([
    ['a Map', () => new Map([['a', 1]]), /the data is a Map, which JSON would send as \{\}/],
    ['a Set in a property', () => ({ tags: new Set(['x']) }), /property "tags" is a Set/],
    ['a Map deep in an array', () => ({ rows: [{ by: new Map() }] }), /property "by" is a Map/],
    [
      'a Promise not awaited',
      () => Promise.resolve({ id: 1 }),
      /the data is a Promise, which JSON would send as \{\}: await it first/,
    ],
    [
      'a Promise in a property',
      () => ({ total: Promise.resolve(2) }),
      /property "total" is a Promise, which JSON would send as \{\}/,
    ],
    [
      'an async generator',
      () =>
        (async function* () {
          yield Buffer.from('a');
        })(),
      /the data is an async iterable, which JSON would send as \{\}: send Readable.from\(it\)/,
    ],
    [
      'a web ReadableStream in a property',
      () => ({ body: new ReadableStream() }),
      /property "body" is an async iterable/,
    ],
  ])('refuses %s with a TypeError rather than send {}', async (_what, data, message) => {
    await expect(
      lastValueFrom(t.client.emit('shapes.in', data()), { defaultValue: undefined }),
    ).rejects.toThrow(message);
    await transport.whenIdle();
    expect(received).toHaveLength(0);
  });

  it('answers send() with an error when the @MessagePattern result holds a Map', async () => {
    // Answered as any failed request is: the error's message, as Nest's clients deliver it.
    await expect(lastValueFrom(t.client.send('shapes.totals', {}))).rejects.toMatchObject({
      status: 'error',
      message: expect.stringMatching(/the reply cannot be encoded: the property "totals" is a Map/),
    });
  });

  it('answers send() with a @MessagePattern result { records: [...], total } as the object', async () => {
    await expect(lastValueFrom(t.client.send('shapes.query', {}))).resolves.toEqual({
      records: [{ id: 1 }, { id: 2 }],
      total: 2,
    });
  });

  it('gives @Payload(key) the property of an object payload', async () => {
    await expect(lastValueFrom(t.client.send('shapes.sku', { sku: 'A-1' }))).resolves.toEqual({
      type: 'string',
      sku: 'A-1',
    });
  });

  it.each([
    ['a string', 'A-1'],
    ['a number', 42],
    ['a Buffer', Buffer.from('A-1')],
  ])('gives @Payload(key) undefined for %s payload, as Nest does', async (_what, data) => {
    await expect(lastValueFrom(t.client.send('shapes.sku', data))).resolves.toEqual({
      type: 'undefined',
      sku: null,
    });
  });

  it('answers send() with a @MessagePattern result that is a Float32Array with its bytes', async () => {
    const reply = await lastValueFrom(t.client.send<Buffer>('shapes.samples', {}));
    expect(Buffer.isBuffer(reply) && [...reply]).toEqual([
      ...Buffer.from(new Float32Array([1.5, -2]).buffer),
    ]);
  });
});
