/** Injection token of the resolved Outbox / Inbox options. */
export const OUTBOX_OPTIONS = Symbol('nest-sequence:outbox-options');
