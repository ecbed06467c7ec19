/** Injection token of the module's `TransfersSettings` (see transfers.environment.ts). */
export const TRANSFERS_SETTINGS = Symbol('demo:transfers-settings');
