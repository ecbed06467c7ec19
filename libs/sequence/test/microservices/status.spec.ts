import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { firstValueFrom, lastValueFrom, timeout, type Observable } from 'rxjs';
import { InMemoryTransport, SequenceModule, type Transport } from 'nest-sequence';
import { ReplyNotSupportedError, SequenceServer } from 'nest-sequence/microservices';
import { ForwardingTransport } from 'nest-sequence/testing';
import { createMicroserviceTestApp } from './microservice-test-app';

@Controller()
class Notes {
  @EventPattern('st.notes')
  note() {
    return undefined;
  }
}

@Controller()
class Answers {
  @MessagePattern('st.ask')
  ask() {
    return 'yes';
  }
}

/** A transport that cannot route replies: a `@MessagePattern` fails the listen. */
class NoRepliesTransport extends ForwardingTransport {
  readonly name = 'no-replies';

  constructor(inner: Transport) {
    super(inner, ['openReplyChannel', 'isReplyChannel']);
  }
}

/** The latest status, or a TimeoutError when none came: `status` replays its latest value. */
const latest = (status: Observable<string>) => firstValueFrom(status.pipe(timeout(1_000)));

/** The statuses `status` emits from now until `during` resolves. */
async function emitted(status: Observable<string>, during: () => Promise<unknown>) {
  const seen: string[] = [];
  const subscription = status.subscribe((each) => seen.push(each));
  try {
    await during();
  } finally {
    subscription.unsubscribe();
  }
  return seen;
}

describe('microservices: the status of SequenceServer and SequenceClient', () => {
  it('says the server is connected once listen() resolved, and disconnected at close', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({ sequence: { transport }, controllers: [Notes] });
    try {
      await expect(latest(t.app.status)).resolves.toBe('connected');
    } finally {
      expect(await emitted(t.app.status, () => t.close())).toEqual(['connected', 'disconnected']);
    }
  });

  it('says a server whose listen() failed is disconnected', async () => {
    const inner = new InMemoryTransport();
    const transport = new NoRepliesTransport(inner);
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport })],
      controllers: [Answers],
    }).compile();
    const server = new SequenceServer();
    const app = moduleRef.createNestMicroservice({ strategy: server, logger: false });
    try {
      const seen = await emitted(server.status, () =>
        expect(app.listen()).rejects.toThrow(ReplyNotSupportedError),
      );
      expect(seen).toEqual(['disconnected']);
    } finally {
      await app.close();
      await inner.close();
    }
  });

  it('says the client is connected once it connects, and disconnected at close', async () => {
    const transport = new InMemoryTransport();
    const t = await createMicroserviceTestApp({
      sequence: { transport },
      controllers: [Notes, Answers],
    });
    const seen: string[] = [];
    const subscription = t.client.status.subscribe((each) => seen.push(each));
    try {
      expect(seen).toEqual([]); // before its first emit() or send()
      await lastValueFrom(t.client.emit('st.notes', {}));
      expect(seen).toEqual(['connected']);
      await t.client.close();
      expect(seen).toEqual(['connected', 'disconnected']);
      // A client closed connects again at its next send().
      await expect(lastValueFrom(t.client.send('st.ask', {}))).resolves.toBe('yes');
      expect(seen).toEqual(['connected', 'disconnected', 'connected']);
    } finally {
      subscription.unsubscribe();
      await t.close();
    }
  });
});
