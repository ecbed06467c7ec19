import { randomBytes } from 'node:crypto';
import { Controller } from '@nestjs/common';
import { EventPattern, Payload } from '@nestjs/microservices';
import { lastValueFrom } from 'rxjs';
import { InMemoryTransport } from 'nest-sequence';
import { eventually } from '../support/sequence-test-app';
import {
  createMicroserviceTestApp,
  type MicroserviceTestApp,
} from '../microservices/microservice-test-app';
import { recordEvents } from './event-recorder';

const received: number[] = [];

@Controller()
class ScanController {
  @EventPattern('events.scans')
  take(@Payload() data: Buffer) {
    received.push(data.length);
  }
}

/** `@EventPattern` handlers run the module's consumers: the same events as decorated handlers. */
describe('lifecycle events: @nestjs/microservices', () => {
  let t: MicroserviceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('a payload sent by size: a sequence started and completed, or a claim checked in, out and deleted', async () => {
    const transport = new InMemoryTransport();
    t = await createMicroserviceTestApp({
      sequence: {
        transport,
        sequence: { fragmentBytes: 64 * 1024 },
        claimCheck: { inlineMaxBytes: 16 * 1024, sequenceMaxBytes: 1024 * 1024 },
      },
      controllers: [ScanController],
    });
    const recorder = recordEvents(t.app);

    await lastValueFrom(t.client.emit('events.scans', randomBytes(200 * 1024)), {
      defaultValue: undefined,
    });
    await eventually(() => received.length === 1, 'the sequence handled');
    await lastValueFrom(t.client.emit('events.scans', randomBytes(2 * 1024 * 1024)), {
      defaultValue: undefined,
    });
    await eventually(() => received.length === 2, 'the claimed payload handled');
    await transport.whenIdle();

    const types = recorder.events.map((event) => event.type);
    expect(types.filter((type) => type.startsWith('sequence.'))).toEqual([
      'sequence.started',
      'sequence.completed',
    ]);
    expect(types.filter((type) => type === 'fragment.accepted')).toHaveLength(4);
    expect(types.filter((type) => type.startsWith('claim.'))).toEqual([
      'claim.checked-in',
      'claim.checked-out',
      'claim.deleted',
    ]);
    expect(recorder.only('claim.deleted')[0]).toMatchObject({ reason: 'consumed' });
    expect(recorder.only('sequence.completed')[0]).toMatchObject({
      channel: 'events.scans',
      fragments: 4,
      bytes: 200 * 1024,
    });
  });
});
