// An application on the embedded defaults: it imports the root entry point only, and has none of
// the optional peers installed. See test/package.e2e-spec.ts.
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { SequenceModule } from 'nest-sequence';
import { report, ScanRoundTrip } from './scan-round-trip';

const MiB = 1024 * 1024;

@Module({ imports: [SequenceModule.forRoot()], providers: [ScanRoundTrip] })
class AppModule {}

async function main(): Promise<void> {
  const app = await NestFactory.createApplicationContext(AppModule, { logger: ['error', 'warn'] });
  const roundTrip = await app.get(ScanRoundTrip).run(40 * MiB);
  await app.close();
  report(roundTrip);
}

void main();
