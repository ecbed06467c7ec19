import { type CanActivate, type ExecutionContext, Injectable, Module } from '@nestjs/common';
import {
  ClaimCheckService,
  InMemoryTransport,
  MemorySequenceStore,
  Resequenced,
  SequencedHandler,
  SEQUENCE_TRANSPORT,
  type ReassembledPayload,
  type ResequencedEvent,
  type Transport,
} from 'nest-sequence';
import { ForwardingTransport } from 'nest-sequence/testing';
import { bytes, makeFragments, publishAll } from '../support/sequence-test-app';
import { createAdminApp, SwitchGuard, type AdminApp } from './admin-app';

const CHANNEL = 'admin-api.images';

@Injectable()
class ImagesHandler {
  @SequencedHandler({ channel: CHANNEL })
  async handle(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }
}

describe('the admin API on the embedded defaults', () => {
  let admin: AdminApp;
  let transport: Transport;

  beforeAll(async () => {
    admin = await createAdminApp({ providers: [ImagesHandler] });
    transport = admin.app.get<Transport>(SEQUENCE_TRANSPORT);
  });

  afterAll(() => admin.close());

  it('lists an open sequence with its received and missing positions', async () => {
    const fragments = makeFragments('study-1', bytes(4000), 1000);
    await publishAll(transport, CHANNEL, [fragments[0], fragments[2]]);

    const list = await admin.get<{ items: Record<string, unknown>[] }>('sequences');
    expect(list.status).toBe(200);
    expect(list.body.items).toEqual([
      expect.objectContaining({
        channel: CHANNEL,
        sequenceId: 'study-1',
        received: [
          [1, 1],
          [3, 3],
        ],
        missing: [
          [2, 2],
          [4, 4],
        ],
        receivedCount: 2,
        missingCount: 2,
        truncated: false,
        declaredFragments: 4,
        bytes: 2000,
        complete: false,
        leaseHolder: null,
      }),
    ]);
    const one = await admin.get(`sequences/${CHANNEL}/study-1`);
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({
      sequenceId: 'study-1',
      missing: [
        [2, 2],
        [4, 4],
      ],
    });
    expect(one.body).not.toHaveProperty('missingPositions');
  });

  it('answers 404 not-found for a sequence that is not open', async () => {
    const answer = await admin.get(`sequences/${CHANNEL}/never-sent`);
    expect(answer).toEqual({
      status: 404,
      body: { error: 'not-found', message: expect.stringContaining('never-sent') },
    });
  });

  it('answers 400 bad-request for a limit out of bounds', async () => {
    const answer = await admin.get('sequences?limit=0');
    expect(answer.status).toBe(400);
    expect(answer.body).toMatchObject({ error: 'bad-request' });
  });

  it('refuses every mutation with 403 mutations-disabled by default', async () => {
    for (const route of [
      'outbox/retry',
      'outbox/discard',
      'inbox/retry',
      'inbox/discard',
      `dead-letters/${CHANNEL}/replay`,
      `dead-letters/${CHANNEL}/discard`,
      'resequencer/gaps/any/key-1/skip',
      'resequencer/gaps/any/key-1/release',
    ]) {
      const answer = await admin.post(route, { ids: ['x'] });
      expect({ route, ...answer }).toEqual({
        route,
        status: 403,
        body: { error: 'mutations-disabled', message: expect.any(String) },
      });
    }
  });

  it('gives an overview with the open sequences and no problems', async () => {
    const answer = await admin.get('overview');
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({
      mutations: false,
      problems: [],
      deadLetters: { total: 0, channels: 0, supported: true },
      sequences: { open: 1, storedBytes: expect.any(Number), limitBytes: expect.any(Number) },
      resequencer: { openGaps: 0 },
      outbox: { pending: 0, failed: 0, lagMs: 0 },
      inbox: { pending: 0, failed: 0 },
    });
  });

  it('finds an open sequence by its id', async () => {
    const answer = await admin.get<{ matches: Record<string, unknown>[] }>('find/study-1');
    expect(answer.status).toBe(200);
    expect(answer.body.matches).toEqual([
      expect.objectContaining({ kind: 'sequence', channel: CHANNEL, sequenceId: 'study-1' }),
    ]);
    // As GET sequences answers: positions as capped ranges, never whole arrays.
    expect(answer.body.matches[0]).toHaveProperty('received');
    expect(answer.body.matches[0]).not.toHaveProperty('receivedPositions');
  });

  it('tells a claim-check payload by ref, bare or store-qualified, and finds it', async () => {
    const ticket = await admin.app.get(ClaimCheckService).checkIn(bytes(5000));
    // Refs may hold slashes: path parameters are URL-encoded.
    const bare = await admin.get(`claims/${encodeURIComponent(ticket.ref)}`);
    expect(bare).toEqual({
      status: 200,
      body: expect.objectContaining({
        ref: ticket.ref,
        status: 'published',
        store: ticket.store,
        bytes: 5000,
      }),
    });
    const qualified = await admin.get(
      `claims/${encodeURIComponent(`${ticket.store}:${ticket.ref}`)}`,
    );
    expect(qualified.body).toMatchObject({ status: 'published', bytes: 5000 });
    const found = await admin.get<{ matches: Record<string, unknown>[] }>(
      `find/${encodeURIComponent(ticket.ref)}`,
    );
    expect(found.body.matches).toEqual([expect.objectContaining({ kind: 'claim', bytes: 5000 })]);
  });

  it('says a claim ref it does not hold is not-found', async () => {
    const answer = await admin.get('claims/no-such-ref');
    expect(answer).toEqual({ status: 200, body: { ref: 'no-such-ref', status: 'not-found' } });
  });
});

/** Knows operators by a token; a dependency injected into the guard class. */
@Injectable()
class Operators {
  named(token: unknown): string | undefined {
    return token === 'secret-1' ? 'alice' : undefined;
  }
}

/** A guard class with a dependency: provided in the console's module, from `imports`. */
@Injectable()
class TokenGuard implements CanActivate {
  constructor(private readonly operators: Operators) {}

  canActivate(context: ExecutionContext): boolean {
    const request = context
      .switchToHttp()
      .getRequest<{ headers: Record<string, unknown>; user?: unknown }>();
    const name = this.operators.named(request.headers['x-operator-token']);
    request.user = name;
    return name !== undefined;
  }
}

@Module({ providers: [Operators], exports: [Operators] })
class OperatorsModule {}

describe('the admin API mounted elsewhere, from forRootAsync, behind a guard class', () => {
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      async: {
        path: 'ops/sequence',
        guard: TokenGuard,
        imports: [OperatorsModule],
        factory: async () => ({ mutations: true, maxBatch: 10 }),
      },
    });
  });

  it('lets in the requests its guard class accepts, and only those', async () => {
    expect((await admin.get('overview')).body).toMatchObject({ error: 'forbidden' });
    const wrong = await admin.getWith('overview', { 'x-operator-token': 'guess' });
    expect(wrong.status).toBe(403);
    const right = await admin.getWith('overview', { 'x-operator-token': 'secret-1' });
    expect(right).toMatchObject({ status: 200, body: { mutations: true } });
  });

  afterAll(() => admin.close());

  it('serves under its path, with the options the factory gave', async () => {
    const token = { 'x-operator-token': 'secret-1' };
    expect(admin.api).toMatch(/\/ops\/sequence\/api$/);
    expect((await admin.getWith('sequences?limit=11', token)).status).toBe(400);
    expect((await admin.getWith('sequences?limit=10', token)).status).toBe(200);
  });

  it('answers 404 for a route it does not have', async () => {
    const answer = await admin.getWith('no-such-route', { 'x-operator-token': 'secret-1' });
    expect(answer.status).toBe(404);
  });
});

/** The in-memory transport without its dead-letter box, as a transport that has none. */
class BoxlessTransport extends ForwardingTransport {
  readonly name = 'boxless';

  constructor(inner: Transport) {
    super(inner, ['deadLetters']);
  }
}

describe('the admin API over adapters lacking its capabilities', () => {
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { mutations: true },
      sequence: {
        transport: new BoxlessTransport(new InMemoryTransport()),
        sequence: {
          store: Object.assign(new MemorySequenceStore(), {
            listOpen: undefined,
            inspect: undefined,
          }),
        },
      },
    });
  });

  afterAll(() => admin.close());

  it('answers 501 unsupported for dead letters when the transport has no dead-letter box', async () => {
    for (const answer of [
      await admin.get('dead-letters'),
      await admin.get('dead-letters/some.channel'),
      await admin.post('dead-letters/some.channel/replay', { all: true }),
    ]) {
      expect(answer).toEqual({
        status: 501,
        body: { error: 'unsupported', message: expect.stringContaining('boxless') },
      });
    }
  });

  it('answers 501 unsupported for open sequences when the store cannot list them', async () => {
    expect((await admin.get('sequences')).status).toBe(501);
    expect((await admin.get('sequences/some.channel/seq-1')).status).toBe(501);
  });

  it('still gives the overview and finds what the other sources hold', async () => {
    expect((await admin.get('overview')).body).toMatchObject({
      deadLetters: { total: 0, channels: 0, supported: false },
    });
    expect(await admin.get('find/anything')).toEqual({ status: 200, body: { matches: [] } });
  });
});

const STATUS = 'admin-api.status';

@Injectable()
class StatusHandler {
  @Resequenced({ channel: STATUS, gap: { timeoutMs: 3_600_000, policy: 'alert' } })
  handle(_event: ResequencedEvent): void {}
}

/** `count` ids of `length` characters each, all different. */
function longIds(count: number, length: number): string[] {
  return Array.from({ length: count }, (_, index) => `${index}-`.padEnd(length, 'x'));
}

describe('the admin API on ids, keys and bodies past what the stores hold', () => {
  const guard = new SwitchGuard();
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      providers: [StatusHandler],
      admin: { guard, mutations: true, maxBatch: 1000 },
      sequence: { outbox: { routes: { event: () => ['admin-api.orders'] } } },
    });
  });

  afterAll(() => admin.close());

  it('answers 400 bad-request for a row id no outbox or inbox row can have', async () => {
    // A lone surrogate (an emoji cut in half, sent as the JSON escape "\ud83d"): no store keeps it.
    for (const id of ['x'.repeat(201), 'a\nb', 'a\u0000b', 'order-\ud83d']) {
      for (const route of ['outbox/retry', 'outbox/discard', 'inbox/retry', 'inbox/discard']) {
        const answer = await admin.post(route, { ids: ['order-1', id] });
        expect({ route, id, ...answer }).toEqual({
          route,
          id,
          status: 400,
          body: { error: 'bad-request', message: expect.stringContaining('200 characters') },
        });
      }
    }
    // As long as a message id may be: taken, and nothing to change.
    const longest = await admin.post('outbox/retry', { ids: ['x'.repeat(200)] });
    expect(longest).toMatchObject({ status: 200, body: { changed: 0 } });
  });

  it('finds nothing, without an error, for an id no outbox or inbox row can have', async () => {
    for (const id of ['x'.repeat(300), 'a\u0000b']) {
      const answer = await admin.get(`find/${encodeURIComponent(id)}`);
      expect(answer).toEqual({ status: 200, body: { matches: [] } });
    }
  });

  it('answers 400 bad-request for a resequencer key no store can hold', async () => {
    for (const route of [
      `resequencer/gaps/${STATUS}/${'k'.repeat(300)}/skip`,
      `resequencer/gaps/${STATUS}/a%0Ab/release`,
    ]) {
      const answer = await admin.post(route);
      expect({ route, ...answer }).toEqual({
        route,
        status: 400,
        body: { error: 'bad-request', message: expect.stringContaining('256 characters') },
      });
    }
  });

  it("answers a batch past the app's JSON body limit with 413 too-large, and takes it once the app raises that limit", async () => {
    // 1000 ids of 150 characters: about 150 kB of JSON, past Express's default 100 kB.
    const ids = longIds(1000, 150);
    const refused = await admin.post('outbox/retry', { ids });
    expect(refused).toEqual({
      status: 413,
      body: {
        error: 'too-large',
        message: expect.stringMatching(/JSON body limit.*useBodyParser/),
      },
    });

    const raised = await createAdminApp({
      admin: { guard, mutations: true, maxBatch: 1000 },
      sequence: { outbox: { routes: { event: () => ['admin-api.orders'] } } },
      configure: (app) => app.useBodyParser('json', { limit: '1mb' }),
    });
    try {
      const taken = await raised.post('outbox/retry', { ids: longIds(1000, 200) });
      expect(taken).toEqual({
        status: 200,
        body: { changed: 0, message: expect.stringMatching(/^nothing changed/) },
      });
    } finally {
      await raised.close();
    }
  });

  it('answers a path parameter that is not valid percent-encoding with 400 bad-request', async () => {
    for (const route of ['dead-letters/images%E0%A4%A', 'sequences/images/%C3%28', 'find/%zz%ff']) {
      const response = await fetch(`${admin.api}/${route}`);
      const text = await response.text();
      expect({ route, status: response.status, text }).toEqual({
        route,
        status: 400,
        text: expect.stringMatching(/^\{"error":"bad-request","message":".*decode/),
      });
    }
  });

  it('answers a body that is not JSON with 400 bad-request', async () => {
    const answer = await admin.postRaw('outbox/retry', '{"ids": [', {
      'content-type': 'application/json',
      'x-sequence-admin': '1',
    });
    expect(answer).toEqual({
      status: 400,
      body: { error: 'bad-request', message: expect.any(String) },
    });
  });
});
