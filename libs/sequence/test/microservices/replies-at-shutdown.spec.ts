import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Controller, Inject, Injectable } from '@nestjs/common';
import { ClientsModule, MessagePattern, Payload, type ClientProxy } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { lastValueFrom } from 'rxjs';
import {
  FilesystemPayloadStore,
  InMemoryTransport,
  SequenceModule,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { SequenceClient } from 'nest-sequence/microservices';
import { eventually } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

const REQUESTER = 'REQUESTER';

/** The answers held back, one per request the handler took. */
const held: Array<() => void> = [];

@Controller()
class HeldAnswers {
  /** Answers `size` bytes once the test lets it. */
  @MessagePattern('shutdown.bytes')
  async bytes(@Payload() request: { size: number }) {
    await new Promise<void>((resolve) => held.push(resolve));
    return Buffer.alloc(request.size, 7);
  }
}

/**
 * Lets its request in flight finish as its application shuts down, as a graceful service does
 * (an HTTP server lets the requests it serves end).
 */
@Injectable()
class Requester {
  inFlight: Promise<unknown> | undefined;
  shutdownBegan!: () => void;
  readonly shuttingDown = new Promise<void>((resolve) => (this.shutdownBegan = resolve));

  constructor(@Inject(REQUESTER) private readonly client: ClientProxy) {}

  ask(size: number): Promise<unknown> {
    this.inFlight = lastValueFrom(this.client.send('shutdown.bytes', { size }));
    return this.inFlight;
  }

  /** After every module's onModuleDestroy: the module's own consumers have stopped. */
  async beforeApplicationShutdown(): Promise<void> {
    this.shutdownBegan();
    await this.inFlight?.catch(() => undefined);
  }
}

describe('SequenceClient while its application shuts down', () => {
  const transport = new InMemoryTransport();
  let dir: string;
  let responder: MicroserviceTestApp;
  /** What both applications share: the transport, and the payload store and keys of tickets. */
  let shared: SequenceModuleOptions;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'replies-at-shutdown-'));
    shared = {
      transport,
      sequence: { fragmentBytes: 1024 },
      claimCheck: {
        store: new FilesystemPayloadStore({ root: dir }),
        signingKeys: [{ id: 'shared', secret: randomBytes(32) }],
        inlineMaxBytes: 1024,
        sequenceMaxBytes: 8 * 1024,
      },
    };
    responder = await createMicroserviceTestApp({ sequence: shared, controllers: [HeldAnswers] });
  });

  afterAll(async () => {
    for (const answer of held.splice(0)) answer();
    await responder?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it.each([
    ['inline', 100],
    ['as a Message Sequence', 4 * 1024],
    ['behind a claim ticket', 32 * 1024],
  ])('delivers a reply sent %s that comes once the shutdown began', async (_via, size) => {
    const requesterRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot(shared),
        ClientsModule.register([
          { name: REQUESTER, customClass: SequenceClient, options: { replyTimeoutMs: 5_000 } },
        ]),
      ],
      providers: [Requester],
    }).compile();
    requesterRef.useLogger(['error']);
    await requesterRef.init();
    const requester = requesterRef.get(Requester);
    const reply = requester.ask(size);
    reply.catch(() => undefined);
    await eventually(() => held.length === 1, 'the request reached its handler');
    const closing = requesterRef.close();
    await requester.shuttingDown;
    const answeredAt = Date.now();
    held.shift()!();
    await expect(reply).resolves.toEqual(Buffer.alloc(size, 7));
    expect(Date.now() - answeredAt).toBeLessThan(2_000); // read as it came, not after retries
    await closing;
  });
});
