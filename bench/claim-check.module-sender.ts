/**
 * The module sender of the Claim Check benchmark: a Nest application whose only work is
 * `ClaimCheckService.publish(queue, stream)` of the generated payload, a `Readable` over an async
 * generator of fresh chunks (never one Buffer of the payload). Over the threshold, publish
 * streams it through the library's SHA-256 meter into the FilesystemPayloadStore (a temporary
 * file, its metadata, a rename), publishes the signed ticket on RabbitMQ, waits for the
 * broker's confirm, and marks the payload published.
 *
 * Marks: `start` (the command arrived), `putStart` / `putEnd` (the store's put: every byte on
 * disk), `markPublishedStart` (the ticket is confirmed) / `markPublishedEnd`, `published`
 * (publish resolved).
 */
import 'reflect-metadata';
import { Readable } from 'node:stream';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClaimCheckService } from 'nest-sequence';
import type { Role, RoleContext } from './claim-check.child';
import { claimCheckModule, logger } from './claim-check.module-app';
import { generatedPayload, payloadBlock } from './claim-check.payload';
import type { ChildConfig } from './claim-check.protocol';

export async function startSender(config: ChildConfig, context: RoleContext): Promise<Role> {
  const { transport, module } = await claimCheckModule(config, (name) =>
    context.currentRun()?.mark(name),
  );

  @Module({ imports: [module] })
  class SenderModule {}

  const app = await NestFactory.createApplicationContext(SenderModule, {
    logger: logger('sender'),
  });
  const claimCheck = app.get(ClaimCheckService);
  const block = payloadBlock(config.seed, config.chunkBytes);
  return {
    async handle(message, run) {
      if (message.type !== 'send') throw new Error(`the sender cannot ${message.type}`);
      run.mark('start');
      const payload = Readable.from(generatedPayload(run.bytes, block), { objectMode: false });
      const receipt = await claimCheck.publish(config.queue, payload, {
        contentType: 'application/octet-stream',
      });
      run.mark('published');
      if (receipt.via !== 'ticket' || !receipt.ticket) {
        throw new Error(`publish sent the payload ${receipt.via}, not behind a ticket`);
      }
      run.stored(receipt.bytes, receipt.ticket.sha256, receipt.ticket.ref);
      run.settle();
    },
    stop: async () => {
      await app.close();
      await transport.close();
    },
  };
}
