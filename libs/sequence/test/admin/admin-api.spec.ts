import { Injectable } from '@nestjs/common';
import {
  SequencedHandler,
  SEQUENCE_TRANSPORT,
  type ReassembledPayload,
  type Transport,
} from 'nest-sequence';
import { bytes, makeFragments, publishAll } from '../support/sequence-test-app';
import { createAdminApp, type AdminApp } from './admin-app';

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
        receivedPositions: [1, 3],
        missingPositions: [2, 4],
        declaredFragments: 4,
        bytes: 2000,
        complete: false,
        leaseHolder: null,
      }),
    ]);
    const one = await admin.get(`sequences/${CHANNEL}/study-1`);
    expect(one.status).toBe(200);
    expect(one.body).toMatchObject({ sequenceId: 'study-1', missingPositions: [2, 4] });
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
  });

  it('says a claim ref it does not hold is not-found', async () => {
    const answer = await admin.get('claims/no-such-ref');
    expect(answer).toEqual({ status: 200, body: { ref: 'no-such-ref', status: 'not-found' } });
  });
});
