/**
 * What the Claim Check benchmark's sender and receiver processes share: the same SequenceModule
 * configuration (RabbitMqTransport, a FilesystemPayloadStore on the shared root, the same ticket
 * signing key, no sweepers), each process's store wrapped to note when the library calls it.
 */
import { type DynamicModule, Logger } from '@nestjs/common';
import { FilesystemPayloadStore, SequenceModule, type SequenceModuleOptions } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { nestLogger } from './harness/nest-logger';
import { SIGNING_SECRET_ENV, type ChildConfig } from './claim-check.protocol';
import { TracedPayloadStore, type MarkFn } from './claim-check.traced-store';

/** Nest and library logs go to stderr (the parent's stdout carries only JSON lines). */
export const logger = nestLogger;

export interface ModuleParts {
  readonly transport: RabbitMqTransport;
  readonly module: DynamicModule;
}

/** Connects the transport and builds `SequenceModule.forRoot` for a sender or a receiver. */
export async function claimCheckModule(config: ChildConfig, mark: MarkFn): Promise<ModuleParts> {
  Logger.overrideLogger(logger(config.role));
  const secret = process.env[SIGNING_SECRET_ENV];
  if (!secret) throw new Error(`${SIGNING_SECRET_ENV} is not set`);
  const transport = await RabbitMqTransport.connect(config.amqpUrl, {
    unsafeSocketTricks: config.unsafeSocketTricks,
  });
  const claimCheck: SequenceModuleOptions['claimCheck'] = {
    store: new TracedPayloadStore(new FilesystemPayloadStore({ root: config.storeRoot }), mark),
    signingKeys: [{ id: config.signingKeyId, secret: Buffer.from(secret, 'hex') }],
    deleteAfter: 'ack',
  };
  return {
    transport,
    module: SequenceModule.forRoot({
      transport,
      claimCheck,
      // The benchmark cleans up after itself; a sweep mid-run would only add noise.
      tuning: { sweepers: { expiry: { intervalMs: false }, orphans: { intervalMs: false } } },
    }),
  };
}
