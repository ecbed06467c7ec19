import { Injectable } from '@nestjs/common';
import { InMemoryTransport, SequencedHandler, type ReassembledPayload } from 'nest-sequence';
import { bytes, makeFragments, publishAll } from '../support/sequence-test-app';
import { createAdminApp, type AdminApp } from './admin-app';

// With the module's `sequence.deadLetterChannel`, every sequence channel dead-letters into one
// channel, and nothing in a dead letter says which channel it came from.
const SCANS = 'shared-dlq.scans';
const IMAGES = 'shared-dlq.images';
const SHARED = 'shared-dlq.errors';

@Injectable()
class TwoHandlers {
  @SequencedHandler({ channel: SCANS })
  async scans(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }

  @SequencedHandler({ channel: IMAGES })
  async images(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
  }
}

interface Listed {
  readonly items: { readonly id: string; readonly channel: string }[];
}

describe('the admin API over channels sharing one dead-letter channel', () => {
  const transport = new InMemoryTransport();
  const published: string[] = [];
  let admin: AdminApp;

  beforeAll(async () => {
    admin = await createAdminApp({
      admin: { mutations: true },
      sequence: { transport, sequence: { deadLetterChannel: SHARED } },
      providers: [TwoHandlers],
    });
    // A fragment of scans whose body fails its checksum: dead-lettered into the shared channel.
    const [fragment] = makeFragments('scan-1', bytes(2_000, 3), 1_000);
    await publishAll(transport, SCANS, [{ ...fragment, body: Buffer.alloc(1_000) }]);
    await transport.whenIdle();
    expect(transport.depth(SHARED)).toBe(1);
    const publish = transport.publish.bind(transport);
    transport.publish = async (channel, body, headers, options) => {
      published.push(channel);
      return publish(channel, body, headers, options);
    };
  });

  afterAll(() => admin.close());

  it('lists the shared dead-letter channel once, with the channels that share it', async () => {
    const listed = await admin.get<{ channels: Record<string, unknown>[] }>('dead-letters');
    expect(listed.body.channels).toEqual([
      expect.objectContaining({
        channel: SHARED,
        deadLetterChannel: SHARED,
        sharedBy: [IMAGES, SCANS],
        total: 1,
      }),
    ]);
  });

  it('counts each dead letter once in the overview', async () => {
    const overview = await admin.get<{ deadLetters: unknown; problems: { message: string }[] }>(
      'overview',
    );
    expect(overview.body.deadLetters).toEqual({ total: 1, channels: 1, supported: true });
    const messages = overview.body.problems.map((problem) => problem.message);
    expect(messages.filter((message) => message.includes('dead letter'))).toEqual([
      expect.stringContaining(`1 dead letter(s) in ${SHARED}, shared by ${IMAGES}, ${SCANS}`),
    ]);
  });

  it('never attributes a dead letter to one of the sharing channels', async () => {
    for (const channel of [IMAGES, SCANS, SHARED]) {
      const listed = await admin.get<Listed>(`dead-letters/${channel}`);
      expect(listed.body.items.map((item) => item.channel)).toEqual([SHARED]);
    }
    const reasons = await admin.get(`dead-letters/${IMAGES}/reasons`);
    expect(reasons.body).toMatchObject({ channel: SHARED, sharedBy: [IMAGES, SCANS], total: 1 });
  });

  it.each([IMAGES, SHARED])(
    'refuses a replay through %s with 409, naming the sharing channels',
    async (channel) => {
      const replayed = await admin.post<{ error: string; message: string }>(
        `dead-letters/${channel}/replay`,
        { all: true },
      );
      expect(replayed.status).toBe(409);
      expect(replayed.body.error).toBe('conflict');
      expect(replayed.body.message).toContain(`${IMAGES}, ${SCANS} all go to ${SHARED}`);
      expect(replayed.body.message).toContain('which channel each came from');
      await transport.whenIdle();
      expect(published).toEqual([]);
      expect(transport.depth(SHARED)).toBe(1);
    },
  );

  it('refuses a discard of all through one sharing channel, which would take the others', async () => {
    const discarded = await admin.post(`dead-letters/${IMAGES}/discard`, { all: true });
    expect(discarded.status).toBe(409);
    expect(transport.depth(SHARED)).toBe(1);
  });

  it('discards a dead letter by its id, which names it in the shared channel', async () => {
    const listed = await admin.get<Listed>(`dead-letters/${SHARED}`);
    const ids = listed.body.items.map((item) => item.id);
    const discarded = await admin.post(`dead-letters/${IMAGES}/discard`, { ids });
    expect(discarded.status).toBe(200);
    expect(discarded.body).toMatchObject({ changed: 1, done: ids });
    expect(transport.depth(SHARED)).toBe(0);
  });
});
