import { describePartitionedChannelConformance } from '../../../testing/conformance/partitioned-channel.conformance';
import { describeReplyChannelConformance } from '../../../testing/conformance/reply-channel.conformance';
import { describeTransportConformance } from '../../../testing/conformance/transport.conformance';
import { OwnedNatsServer } from '../../../../test/support/processes/owned-nats.server';
import { describeWithServer } from '../../../../test/support/servers';
import { NatsTransport } from './nats.transport';

// The suite publishes messages of 3 MiB and more: over the 1 MiB max_payload of a default server,
// so it runs on a server of its own with a larger one (and a fresh store, removed after).
describeWithServer('nats', 'NatsTransport', () => {
  let server: OwnedNatsServer;

  beforeAll(async () => {
    server = await OwnedNatsServer.start({ maxPayloadBytes: 8 * 1024 * 1024 });
  });

  afterAll(async () => {
    await server?.dispose();
  });

  for (const unsafeSocketTricks of [false, true]) {
    describeTransportConformance(
      `nats (JetStream)${unsafeSocketTricks ? ', unsafeSocketTricks' : ''}`,
      {
        create: () =>
          NatsTransport.connect(
            { servers: server.url, reconnectTimeWait: 100 },
            { maxMessageBytes: 4 * 1024 * 1024, nakDelayMs: 5, unsafeSocketTricks },
          ),
        offersAbandoned: true,
      },
    );
  }

  describeReplyChannelConformance('nats (JetStream)', {
    create: () =>
      NatsTransport.connect(
        { servers: server.url, reconnectTimeWait: 100 },
        { maxMessageBytes: 4 * 1024 * 1024, nakDelayMs: 5 },
      ),
    // The reply stream takes it; with no consumer interested in its subject, it discards it.
    publishToClosed: 'resolves',
    sharedBroker: true,
  });

  describePartitionedChannelConformance('nats (JetStream)', {
    create: () =>
      NatsTransport.connect({ servers: server.url, reconnectTimeWait: 100 }, { nakDelayMs: 5 }),
    sharedBroker: true,
  });
});
