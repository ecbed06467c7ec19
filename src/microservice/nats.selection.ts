import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { NatsTransport } from 'nest-sequence/nats';
import { DemoEnvironmentError } from '../demo-environment.error';

export const DEMO_NATS_TRANSPORT = Symbol('demo:nats-transport');

/**
 * `NATS_URL` and `AMQP_URL` each pick a broker: refuses both at once, before anything connects.
 * @throws DemoEnvironmentError naming both variables
 */
export function checkBrokerChoice(env: NodeJS.ProcessEnv = process.env): void {
  if (env.NATS_URL && env.AMQP_URL) {
    throw new DemoEnvironmentError(
      ['NATS_URL', 'AMQP_URL'],
      [
        'NATS_URL and AMQP_URL are both set: set one of them (NATS JetStream or RabbitMQ), or neither for the in-memory transport',
      ],
    );
  }
}

/** `NATS_URL` set: the NATS JetStream transport on it; else null. */
export async function natsTransportFromEnvironment(
  env: NodeJS.ProcessEnv = process.env,
): Promise<NatsTransport | null> {
  checkBrokerChoice(env);
  return env.NATS_URL ? NatsTransport.connect({ servers: env.NATS_URL }) : null;
}

/**
 * The NATS JetStream transport when `NATS_URL` is set (null otherwise), closed with the
 * application. The other adapters come from the environment as for every demo
 * (infrastructure.ts).
 */
@Module({
  providers: [{ provide: DEMO_NATS_TRANSPORT, useFactory: () => natsTransportFromEnvironment() }],
  exports: [DEMO_NATS_TRANSPORT],
})
export class NatsSelectionModule implements OnApplicationShutdown {
  constructor(@Inject(DEMO_NATS_TRANSPORT) private readonly nats: NatsTransport | null) {}

  async onApplicationShutdown(): Promise<void> {
    await this.nats?.close();
  }
}
