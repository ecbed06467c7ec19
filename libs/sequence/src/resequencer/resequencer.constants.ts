/** Injection token of the resolved Resequencer module options. */
export const RESEQUENCER_OPTIONS = Symbol('nest-sequence:resequencer-options');
/** Injection token of the active {@link ResequencerStore}. */
export const RESEQUENCER_STORE = Symbol('nest-sequence:resequencer-store');
