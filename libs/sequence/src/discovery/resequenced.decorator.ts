import { handlerDecorator } from './handler-decorator';
import type { ResequencerDefinition } from '../options/resequencer.options';

export const RESEQUENCED_METADATA = 'nest-sequence:resequenced';

/**
 * Marks a provider method as the consumer of a resequenced channel: it receives each key's
 * events as {@link ResequencedEvent}s in strictly increasing sequence order, each once (at least
 * once after a crash mid-delivery), whichever instance took them from the broker. With `output`,
 * released events are also (or, with `callHandler: false`, only) published in order to that
 * channel, with confirms. Early events wait in the resequencer store until the gap before them
 * fills, or until `gap.timeoutMs` applies `gap.policy`. Its second argument is a
 * `HandlerContext`, whose `signal` is aborted when a call runs past `handlerTimeoutMs`; a
 * key's next call still waits until that call has returned (two calls for one key never overlap).
 *
 * @example
 * @Resequenced({ channel: 'pix-status', gap: { timeoutMs: 30_000, policy: 'alert' } })
 * async project(event: ResequencedEvent) { await this.statuses.advance(event.key, event.seq, event.json()); }
 */
export const Resequenced = (definition: ResequencerDefinition): MethodDecorator =>
  handlerDecorator('@Resequenced', RESEQUENCED_METADATA, definition);
