/** Injection token of the resolved Claim Check options. */
export const CLAIM_CHECK_OPTIONS = Symbol('nest-sequence:claim-check-options');
