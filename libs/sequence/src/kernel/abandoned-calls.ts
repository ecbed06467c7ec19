/**
 * Handler calls of this process that ran past `handlerTimeoutMs` and have not returned yet, per
 * key (a resequenced key, an ordered inbox's aggregate). A key's next call waits for them: two
 * calls for one key never overlap. A handler that ignores its `AbortSignal` keeps its key blocked
 * for as long as it runs.
 */
export class AbandonedCalls {
  private readonly running = new Map<string, Set<Promise<void>>>();

  /** `settled` resolves (never rejects) when the abandoned call of `key` has returned or thrown. */
  add(key: string, settled: Promise<void>): void {
    let calls = this.running.get(key);
    if (!calls) this.running.set(key, (calls = new Set()));
    calls.add(settled);
    void settled.then(() => {
      calls.delete(settled);
      if (calls.size === 0 && this.running.get(key) === calls) this.running.delete(key);
    });
  }

  /** Whether an abandoned call of `key` still runs in this process. */
  has(key: string): boolean {
    return this.running.has(key);
  }

  /** Resolves once no abandoned call of `key` runs (at once when none does). */
  async settled(key: string): Promise<void> {
    for (let calls = this.running.get(key); calls; calls = this.running.get(key)) {
      await Promise.all(calls);
    }
  }
}
