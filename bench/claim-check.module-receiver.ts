/**
 * The module receiver of the Claim Check benchmark: a Nest application with one `@ClaimCheck`
 * handler on the run's queue (`deleteAfter: 'ack'`). For each ticket the library verifies the
 * signature and expiry, claims it in the (memory) ledger, reads the payload's metadata (`head`),
 * and calls the handler, which reads `payload.stream()` to the end: the library opens the file
 * (link and traversal checks), streams it, SHA-256-hashes every chunk and compares hash and byte
 * count with the ticket's at the end (a mismatch errors the stream instead of ending it). Then
 * the library records completion in the ledger, deletes the payload, and acks the message.
 *
 * Marks: `headStart` (the ticket passed its checks and the ledger claim), `handlerStart`,
 * `getStart` / `getEnd` (the file is open), `streamEnd` (the store's stream ended),
 * `handlerEnd` (the handler's stream ended, verified: the clock stops), `deleteStart` /
 * `deleteEnd` (then the ack goes out and the run is settled).
 */
import 'reflect-metadata';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClaimCheck, ClaimedPayload } from 'nest-sequence';
import type { Role, RoleContext } from './claim-check.child';
import { claimCheckModule, logger } from './claim-check.module-app';
import type { ChildConfig } from './claim-check.protocol';

export async function startReceiver(config: ChildConfig, context: RoleContext): Promise<Role> {
  const { transport, module } = await claimCheckModule(config, (name) => {
    const run = context.currentRun();
    if (!run) return;
    run.mark(name);
    // The ack follows the delete: let it go out, then report.
    if (name === 'deleteEnd') setImmediate(() => run.settle());
  });

  @Injectable()
  class Drain {
    @ClaimCheck({ channel: config.queue, deleteAfter: 'ack' })
    async consume(payload: ClaimedPayload): Promise<void> {
      try {
        const run = context.currentRun();
        if (!run) throw new Error('a ticket arrived outside a run');
        run.mark('handlerStart');
        if (payload.via !== 'ticket') throw new Error('the payload came inline, not as a ticket');
        let bytes = 0;
        let chunks = 0;
        for await (const chunk of payload.stream()) {
          bytes += (chunk as Buffer).length;
          chunks++;
        }
        run.mark('handlerEnd');
        if (bytes !== run.bytes) {
          throw new Error(`the handler read ${bytes} bytes, the run sent ${run.bytes}`);
        }
        run.chunks = chunks;
        run.done(bytes);
      } catch (error) {
        // Retries and dead-lettering would only delay the news: the run has failed.
        context.fail(error);
        throw error;
      }
    }
  }

  @Module({ imports: [module], providers: [Drain] })
  class ReceiverModule {}

  const app = await NestFactory.createApplicationContext(ReceiverModule, {
    logger: logger('receiver'),
  });
  return {
    handle: async (message) => {
      throw new Error(`the receiver takes no ${message.type} command: tickets come by RabbitMQ`);
    },
    stop: async () => {
      await app.close();
      await transport.close();
    },
  };
}
