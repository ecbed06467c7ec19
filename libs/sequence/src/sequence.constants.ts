/** Injection token of the active {@link Transport}. */
export const SEQUENCE_TRANSPORT = Symbol('nest-sequence:transport');
/** Injection token of the active {@link SequenceStore}. */
export const SEQUENCE_STORE = Symbol('nest-sequence:store');
/** Injection token of the resolved, validated module options. */
export const SEQUENCE_OPTIONS = Symbol('nest-sequence:options');
