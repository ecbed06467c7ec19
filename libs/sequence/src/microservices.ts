/**
 * `nest-sequence/microservices`: the `@nestjs/microservices` integration (peer:
 * @nestjs/microservices 11). `SequenceServer` is a custom transport strategy over the
 * application's `SequenceModule`: `@EventPattern` handlers receive reassembled, claim-checked or
 * ordered payloads through Nest's pipeline. `SequenceClient` is a `ClientProxy` whose `emit`
 * sends by size and whose `send` is request-reply.
 *
 * @module nest-sequence/microservices
 */
export { SequenceServer, SEQUENCE_TRANSPORT_ID } from './microservices/sequence.server';
export type {
  SequenceServerOptions,
  SequenceChannelOptions,
} from './microservices/sequence.server';
export { SequenceClient, type SequenceClientOptions } from './microservices/sequence.client';
export { SequenceRecord, type SequenceRecordOptions } from './microservices/sequence.record';
export { SequenceContext, type SequenceMessageInfo } from './microservices/sequence.context';
export { RpcHeader } from './microservices/rpc-headers';
export { MessageRefusedError, type RefusalCode } from './core/errors/message-refused.error';
export { ReplyNotSupportedError } from './microservices/errors/reply-not-supported.error';
export { ReplyTimeoutError } from './microservices/errors/reply-timeout.error';
export { ReplyUnreadableError } from './microservices/errors/reply-unreadable.error';
export { ClientClosedError } from './microservices/errors/client-closed.error';
