import { Controller } from '@nestjs/common';
import { EventPattern, MessagePattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { eventually } from '../support/sequence-test-app';
import { createMicroserviceTestApp, type MicroserviceTestApp } from './microservice-test-app';

/** 200 KiB: past `inlineMaxBytes` (16 KiB), under `sequenceMaxBytes`: sent as a Message Sequence. */
const SEQUENCE_SIZED = 200 * 1024;
const intakes: number[] = [];

@Controller()
class Sized {
  @MessagePattern('broker-buffer.bytes')
  bytes(@Payload() request: { size: number }) {
    return Buffer.alloc(request.size, 7);
  }

  @MessagePattern('broker-buffer.size-of')
  sizeOf(@Payload() body: Buffer) {
    return { bytes: body.length };
  }

  @EventPattern('broker-buffer.intake')
  intake(@Payload() body: Buffer) {
    intakes.push(body.length);
  }
}

/**
 * The module's `sequence.buffer: 'broker'` is for `@SequencedHandler`s: a microservice's
 * patterns and its reply channels reassemble from the channel itself, so what the client and
 * the server send them as a Message Sequence goes there too, not to partitions nobody reads.
 */
describe("microservices with the module's sequence.buffer: 'broker'", () => {
  let t: MicroserviceTestApp;

  beforeAll(async () => {
    t = await createMicroserviceTestApp({
      sequence: {
        transport: new InMemoryTransport(),
        sequence: { fragmentBytes: 64 * 1024, buffer: 'broker', partitions: 2 },
        claimCheck: { inlineMaxBytes: 16 * 1024, sequenceMaxBytes: 1024 * 1024 },
      },
      controllers: [Sized],
      client: { replyTimeoutMs: 5_000 },
    });
  });

  afterAll(async () => {
    await t?.close();
  });

  it('answers with a reply sent as a Message Sequence', async () => {
    const reply = await lastValueFrom(
      t.client.send('broker-buffer.bytes', { size: SEQUENCE_SIZED }),
    );
    expect(Buffer.from(reply as Buffer).equals(Buffer.alloc(SEQUENCE_SIZED, 7))).toBe(true);
  });

  it('answers a request sent as a Message Sequence', async () => {
    const body = Buffer.alloc(SEQUENCE_SIZED, 1);
    const reply = await lastValueFrom(t.client.send('broker-buffer.size-of', body));
    expect(reply).toEqual({ bytes: SEQUENCE_SIZED });
  });

  it('hands an event emitted as a Message Sequence to its handler', async () => {
    await lastValueFrom(t.client.emit('broker-buffer.intake', Buffer.alloc(SEQUENCE_SIZED, 1)));
    await eventually(() => intakes.length === 1, 'the event handled');
    expect(intakes).toEqual([SEQUENCE_SIZED]);
  });
});
