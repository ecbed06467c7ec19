import { Inject, Injectable } from '@nestjs/common';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { OutboxService, SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import { eventChannel, ORDERS_SETTINGS } from './orders.constants';
import type { OrdersSettings } from './orders.environment';

/**
 * Publishes an event the relay already published once more, straight to the broker, with the
 * same body and headers: what a relay does when it dies after the broker's confirm but before
 * marking the record done, or when a confirm is lost. The inbox must take it as a duplicate.
 */
@Injectable()
export class RelayRetrySimulator {
  constructor(
    private readonly outbox: OutboxService,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(ORDERS_SETTINGS) private readonly settings: OrdersSettings,
  ) {}

  /**
   * Publishes the outbox event `eventId` again; resolves with its channel once the broker
   * confirmed.
   * @throws Error when the outbox holds no such event, or has not published it yet
   */
  async republish(eventId: string): Promise<string> {
    const record = await this.outbox.record('outbox_events', eventId);
    if (record?.status !== 'COMPLETED') {
      throw new Error(
        `outbox event ${eventId} is ${record ? record.status : 'not in the outbox'}: only an ` +
          'event the relay has published can be published again as a duplicate',
      );
    }
    const channel = eventChannel(this.settings.channelPrefix, record.type);
    // The headers the relay sends (outbox.relay.ts): the inbox reads the id and kind from them.
    await this.transport.publish(channel, Buffer.from(record.body), {
      ...record.headers,
      [MESSAGE_ID_HEADER]: record.id,
      [MESSAGE_KIND_HEADER]: record.kind,
      [MESSAGE_TYPE_HEADER]: record.type,
      'content-type': 'application/json',
    });
    return channel;
  }
}
