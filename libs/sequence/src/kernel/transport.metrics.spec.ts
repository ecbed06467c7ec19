import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Registry } from 'prom-client';
import { randomUUID } from 'node:crypto';
import { jetstreamManager } from '@nats-io/jetstream';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { NatsTransport } from '../adapters/transports/nats/nats.transport';
import { streamName } from '../adapters/transports/nats/nats.naming';
import { SequenceModule } from '../sequence.module';
import { connectNats } from '../adapters/transports/nats/nats.client';
import { describeWithServer, SERVERS } from '../../test/support/servers';
import { ForwardingTransport } from '../testing/forwarding.transport';
import { SequencedHandler } from '../discovery/sequenced-handler.decorator';
import type { Subscription, Transport } from '../ports/transport.port';
import { DeadLetterMetrics } from './dead-letter.metrics';

describe('TransportMetrics', () => {
  it('reports the dead letters the in-memory transport dropped', async () => {
    const transport = new InMemoryTransport({ maxDeadLetters: 1 });
    const registry = new Registry();
    const app = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport, metrics: { registry } })],
    })
      .compile()
      .then((moduleRef) => moduleRef.init());
    try {
      app.useLogger(false);
      for (let n = 0; n < 4; n++) await transport.publish('a.dlq', Buffer.from([n]), {});
      const metric = await registry
        .getSingleMetric('nest_sequence_transport_dead_letters_dropped')
        ?.get();
      expect(metric?.values).toEqual([{ labels: { transport: 'in-memory' }, value: 3 }]);
    } finally {
      await app.close();
      await transport.close();
    }
  });
});

describeWithServer('nats', 'TransportMetrics on NATS JetStream', () => {
  it("counts the transport's own max-deliver dead letters in dead_letters_total", async () => {
    const transport = await NatsTransport.connect(
      { servers: SERVERS.nats.url },
      { maxDeliver: 2, nakDelayMs: 0 },
    );
    const channel = `nats-metrics.${randomUUID()}`;
    const registry = new Registry();
    const app = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport, metrics: { registry } })],
    })
      .compile()
      .then((moduleRef) => moduleRef.init());
    const counted = async () =>
      (await registry.getSingleMetric('nest_sequence_dead_letters_total')?.get())?.values ?? [];
    try {
      app.useLogger(false);
      await transport.subscribe(channel, async () => ({ action: 'requeue' }));
      await transport.publish(channel, Buffer.from('poison'), {});
      let values = await counted();
      for (let tries = 0; tries < 200 && values.length === 0; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 25));
        values = await counted();
      }
      expect(values).toEqual([{ labels: { channel, reason: 'max-deliver' }, value: 1 }]);
    } finally {
      await app.close();
      await transport.close();
      const admin = await connectNats({ servers: SERVERS.nats.url });
      const jsm = await jetstreamManager(admin);
      for (const each of [channel, `${channel}.dlq`]) {
        await jsm.streams.delete(streamName('NSEQ_', each)).catch(() => undefined);
      }
      await admin.close();
    }
  });
});

describe('TransportMetrics at shutdown', () => {
  /** Stores a dead letter of its own as each subscription closes (a forward awaited in a drain). */
  class DeadLettersAtClose extends ForwardingTransport {
    readonly name = 'dead-letters-at-close';
    private readonly listeners = new Set<(channel: string, reason: string) => void>();

    override onDeadLetter(listener: (channel: string, reason: string) => void): () => void {
      this.listeners.add(listener);
      return () => this.listeners.delete(listener);
    }

    override async subscribe(...args: Parameters<Transport['subscribe']>): Promise<Subscription> {
      const subscription = await super.subscribe(...args);
      return {
        channel: subscription.channel,
        close: async () => {
          await subscription.close();
          for (const listener of this.listeners) listener(args[0], 'max-deliver: at close');
        },
      };
    }
  }

  @Injectable()
  class Handlers {
    @SequencedHandler({ channel: 'closing.channel' })
    handle(): void {}
  }

  it('counts the dead letters the transport stores while its subscriptions close', async () => {
    const inner = new InMemoryTransport();
    const transport = new DeadLettersAtClose(inner);
    const app = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport, metrics: { registry: new Registry() } })],
      providers: [Handlers],
    })
      .compile()
      .then((moduleRef) => moduleRef.init());
    app.useLogger(false);
    // The registry loses the module's metrics as the app shuts down: the counter is read by
    // what it is told, up to the end.
    const told = jest.spyOn(app.get(DeadLetterMetrics), 'deadLettered');
    await app.close();
    expect(told.mock.calls).toEqual([['closing.channel', 'max-deliver: at close']]);
    await inner.close();
  });
});
