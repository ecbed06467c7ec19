import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  ClaimCheck,
  ClaimCheckService,
  ClaimedPayload,
  FilesystemPayloadStore,
  InMemoryTransport,
  SequenceModule,
} from 'nest-sequence';

describe('claim check smoke', () => {
  it('delivers inline and ticketed payloads to a @ClaimCheck handler', async () => {
    const root = await mkdtemp(join(tmpdir(), 'cc-smoke-'));
    const got: Array<{ via: string; bytes: Buffer }> = [];
    @Injectable()
    class Handler {
      @ClaimCheck({ channel: 'cc.smoke' })
      async handle(payload: ClaimedPayload) {
        got.push({ via: payload.via, bytes: await payload.toBuffer() });
      }
    }
    const transport = new InMemoryTransport();
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          sweepIntervalMs: false,
          claimCheck: {
            store: new FilesystemPayloadStore({ root }),
            threshold: 10,
            sweepIntervalMs: false,
          },
        }),
      ],
      providers: [Handler],
    }).compile();
    const app = await moduleRef.init();
    const claimCheck = app.get(ClaimCheckService);
    const small = await claimCheck.publish('cc.smoke', Buffer.from('tiny'));
    const big = await claimCheck.publish('cc.smoke', Buffer.alloc(1000, 7));
    await transport.whenIdle();
    expect(small.via).toBe('inline');
    expect(big.via).toBe('ticket');
    expect(got.map((g) => g.via).sort()).toEqual(['inline', 'ticket']);
    expect(got.find((g) => g.via === 'ticket')?.bytes.equals(Buffer.alloc(1000, 7))).toBe(true);
    await app.close();
    await rm(root, { recursive: true, force: true });
  });
});
