import { SequenceError } from '../../core/errors/sequence.error';

/**
 * Request-reply (`@MessagePattern`, `ClientProxy.send`) over a transport that cannot route
 * replies: it has no `openReplyChannel`. Thrown when the server listens, or by `send()`.
 */
export class ReplyNotSupportedError extends SequenceError {
  readonly code = 'reply-not-supported' as const;

  constructor(
    readonly transport: string,
    what: string,
  ) {
    super(
      `${what}: the ${transport} transport cannot route replies (it has no openReplyChannel); ` +
        'request-reply needs the in-memory, RabbitMQ or NATS JetStream transport, or one of your ' +
        'own that implements openReplyChannel. Use @EventPattern and emit() on this transport.',
    );
  }
}
