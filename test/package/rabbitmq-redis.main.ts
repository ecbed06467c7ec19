// An application on RabbitMQ and Redis through the subpath entry points (AMQP_URL, REDIS_URL,
// REDIS_PREFIX, SCAN_CHANNEL from the environment). See test/package.e2e-spec.ts.
import { Module, type DynamicModule } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { SequenceModule, type Transport } from 'nest-sequence';
import type { StoreSet } from 'nest-sequence/ports';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { redis } from 'nest-sequence/redis';
import { report, ScanRoundTrip } from './scan-round-trip';

const MiB = 1024 * 1024;

@Module({})
class AppModule {
  static on(transport: Transport, stores: StoreSet): DynamicModule {
    return {
      module: AppModule,
      imports: [SequenceModule.forRoot({ transport, stores })],
      providers: [ScanRoundTrip],
    };
  }
}

async function main(): Promise<void> {
  const transport = await RabbitMqTransport.connect(process.env.AMQP_URL!);
  // Every Redis store over one connection: the module closes the set at shutdown.
  const stores = redis(process.env.REDIS_URL!, { prefix: process.env.REDIS_PREFIX! });
  const app = await NestFactory.createApplicationContext(AppModule.on(transport, stores), {
    logger: ['error', 'warn'],
  });
  const roundTrip = await app.get(ScanRoundTrip).run(40 * MiB);
  // The module closes the store set; the transport is ours.
  await app.close();
  await transport.close();
  report(roundTrip);
}

void main();
