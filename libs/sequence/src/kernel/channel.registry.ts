import { Injectable } from '@nestjs/common';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { deadLetterLoopProblem } from '../core/option-checks';
import type { ChannelBinding } from './channel-binding';

/**
 * The channels this application's handlers consume: one consumer per channel, whatever kind of
 * handler. A second handler on a channel is refused, in whichever order the two are found;
 * bindings marked `shared` of one kind (several inbox handlers on one channel) become one. A
 * handler that would dead-letter into the channel it consumes is refused as well.
 */
@Injectable()
export class ChannelRegistry {
  private readonly byChannel = new Map<string, ChannelBinding>();

  /**
   * @throws SequenceHandlerConflictError when another handler already consumes the channel
   * @throws SequenceOptionsError when the binding dead-letters into its own channel
   */
  add(binding: ChannelBinding): void {
    const loop = deadLetterLoopProblem(
      'deadLetterChannel',
      binding.deadLetterChannel,
      binding.channel,
    );
    if (loop) throw new SequenceOptionsError(`${binding.kind} on ${binding.definedBy}`, [loop]);
    const existing = this.byChannel.get(binding.channel);
    if (!existing) {
      this.byChannel.set(binding.channel, binding);
      return;
    }
    if (!(existing.shared && binding.shared && existing.kind === binding.kind)) {
      throw new SequenceHandlerConflictError(
        binding.channel,
        existing.definedBy,
        binding.definedBy,
      );
    }
    this.byChannel.set(binding.channel, {
      ...existing,
      definedBy: `${existing.definedBy}, ${binding.definedBy}`,
      prefetch: Math.min(existing.prefetch, binding.prefetch),
    });
  }

  /**
   * Adds every binding or none: one refused leaves the registry as it was. Answers what takes
   * them out again (handlers that failed to open, or came too late): their channels as they were
   * before, so that a shared channel they joined keeps the handlers it had.
   * @throws SequenceHandlerConflictError when another handler already consumes a channel
   * @throws SequenceOptionsError when a binding dead-letters into its own channel
   */
  addAll(bindings: readonly ChannelBinding[]): () => void {
    const before = new Map(this.byChannel);
    try {
      for (const binding of bindings) this.add(binding);
    } catch (error) {
      this.byChannel.clear();
      for (const [channel, binding] of before) this.byChannel.set(channel, binding);
      throw error;
    }
    return () => {
      for (const { channel } of bindings) {
        const previous = before.get(channel);
        if (previous) this.byChannel.set(channel, previous);
        else this.byChannel.delete(channel);
      }
    };
  }

  get(channel: string): ChannelBinding | undefined {
    return this.byChannel.get(channel);
  }

  all(): ChannelBinding[] {
    return [...this.byChannel.values()];
  }
}
