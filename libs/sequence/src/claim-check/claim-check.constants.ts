/** Injection token of the resolved Claim Check options. */
export const CLAIM_CHECK_OPTIONS = Symbol('nest-sequence:claim-check-options');
/**
 * Injection token of the Claim Check's payload stores and claim ledger, for health checks: what
 * may be pinged, without the resolved options (their ticket keyring) around it.
 */
export const CLAIM_CHECK_STORES = Symbol('nest-sequence:claim-check-stores');
