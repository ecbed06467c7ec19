import { delay } from '../core/async';
import type { ResolvedRetryPolicy } from '../options/resolved-options';
import { backoff } from './publish-with-retry';

export type HandlerOutcome =
  | { readonly ok: true; readonly attempts: number }
  | { readonly ok: false; readonly attempts: number; readonly error: unknown };

/**
 * Calls a message handler until it returns, or `policy.attempts` calls have thrown, waiting with
 * exponential backoff in between. `isFinal()` is asked after each failure: true stops at once
 * (wrong bytes, a store that cannot be read: calling the handler again now cannot help).
 * Shared by every pattern's consumers.
 */
export async function callHandlerWithRetry(
  call: () => unknown,
  policy: ResolvedRetryPolicy,
  hooks: { onFailure(error: unknown, attempt: number): void; isFinal(): boolean },
): Promise<HandlerOutcome> {
  const { attempts, baseDelayMs, maxDelayMs } = policy;
  for (let attempt = 1; ; attempt++) {
    try {
      await call();
      return { ok: true, attempts: attempt };
    } catch (error) {
      hooks.onFailure(error, attempt);
      if (attempt >= attempts || hooks.isFinal()) return { ok: false, attempts: attempt, error };
      await delay(backoff(attempt, baseDelayMs, maxDelayMs));
    }
  }
}
