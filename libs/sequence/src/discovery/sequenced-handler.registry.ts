import { Injectable } from '@nestjs/common';
import type { SequenceConsumer } from '../sequence/aggregator.service';
import type { FragmentStream } from '../sequence/fragment-stream';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';

/** A discovered `@SequencedHandler`: where it lives and the consumer bound to it. */
export interface RegisteredSequenceHandler {
  /** `ClassName.methodName`, for messages. */
  readonly name: string;
  readonly consumer: SequenceConsumer;
  /** Set for `mode: 'stream'`: fragments go to it instead of the aggregator. */
  readonly stream?: FragmentStream;
}

/** The sequence handlers of this application, by channel. */
@Injectable()
export class SequencedHandlerRegistry {
  private readonly handlers = new Map<string, RegisteredSequenceHandler>();

  add(handler: RegisteredSequenceHandler): void {
    const channel = handler.consumer.channel;
    const existing = this.handlers.get(channel);
    if (existing) throw new SequenceHandlerConflictError(channel, existing.name, handler.name);
    this.handlers.set(channel, handler);
  }

  get(channel: string): RegisteredSequenceHandler | undefined {
    return this.handlers.get(channel);
  }

  all(): RegisteredSequenceHandler[] {
    return [...this.handlers.values()];
  }
}
