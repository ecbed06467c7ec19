export * from './sequence.error';
export * from './rejection-code';
export * from './malformed-fragment.error';
export * from './sequence-integrity.error';
export * from './sequence-publish.error';
export * from './publish-timeout.error';
export * from './message-too-large.error';
export * from './sequence-options.error';
