import { Injectable } from '@nestjs/common';
import type { ClaimCheckConsumer } from '../claim-check/claim-check-consumer';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';

/** A discovered `@ClaimCheck` handler: where it lives and the consumer bound to it. */
export interface RegisteredClaimCheckHandler {
  /** `ClassName.methodName`, for messages. */
  readonly name: string;
  readonly consumer: ClaimCheckConsumer;
}

/** The Claim Check handlers of this application, by channel. */
@Injectable()
export class ClaimCheckRegistry {
  private readonly handlers = new Map<string, RegisteredClaimCheckHandler>();

  add(handler: RegisteredClaimCheckHandler): void {
    const channel = handler.consumer.channel;
    const existing = this.handlers.get(channel);
    if (existing) throw new SequenceHandlerConflictError(channel, existing.name, handler.name);
    this.handlers.set(channel, handler);
  }

  all(): RegisteredClaimCheckHandler[] {
    return [...this.handlers.values()];
  }
}
