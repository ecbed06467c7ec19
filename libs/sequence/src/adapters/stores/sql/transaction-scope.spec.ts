import type { StoreTransaction } from '../../../ports/outbox-store.port';
import { TransactionScope } from './transaction-scope';

/** A transaction that records the savepoints taken on it. */
function fakeTransaction(name: string): StoreTransaction & { savepoints: number; name: string } {
  const transaction = {
    name,
    savepoints: 0,
    dialect: 'sqlite' as const,
    client: undefined,
    query: () => Promise.resolve({ rows: [], rowCount: 0 }),
    savepoint: async <T>(work: () => Promise<T>) => {
      transaction.savepoints++;
      return work();
    },
  };
  return transaction;
}

describe('TransactionScope', () => {
  it('joins the active transaction as a savepoint, and opens one when there is none', async () => {
    const scope = new TransactionScope();
    const outer = fakeTransaction('outer');
    const opened: string[] = [];
    const open = <T>(work: (t: StoreTransaction) => Promise<T>) => {
      opened.push('new');
      return work(outer);
    };
    const seen = await scope.join(open, async () =>
      scope.join(open, async (inner) => (inner as typeof outer).name),
    );
    expect(seen).toBe('outer');
    expect(opened).toEqual(['new']);
    expect(outer.savepoints).toBe(1);
  });

  it('keeps a running transaction active while others start and end beside it, and works again after the last one ended', async () => {
    const scope = new TransactionScope();
    const long = fakeTransaction('long');
    const short = fakeTransaction('short');
    let releaseLong: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (releaseLong = resolve));
    const seenInLong: Array<StoreTransaction | undefined> = [];
    const longRun = scope.run(long, async () => {
      seenInLong.push(scope.active());
      await held;
      seenInLong.push(scope.active());
    });
    await scope.run(short, async () => {
      expect(scope.active()).toBe(short);
    });
    // short ended while long still runs: long's context must survive it.
    releaseLong();
    await longRun;
    expect(seenInLong).toEqual([long, long]);
    expect(scope.active()).toBeUndefined();
    // Every run over: a new one is tracked as before.
    const next = fakeTransaction('next');
    await scope.run(next, async () => {
      await new Promise((resolve) => setImmediate(resolve));
      expect(scope.active()).toBe(next);
    });
  });

  it('does not join a transaction whose run is over (a timer that outlived it)', async () => {
    const scope = new TransactionScope();
    const finished = fakeTransaction('finished');
    let later: () => StoreTransaction | undefined = () => undefined;
    await scope.run(finished, async () => {
      later = () => scope.active();
      expect(scope.active()).toBe(finished);
    });
    expect(later()).toBeUndefined();
    const fresh = fakeTransaction('fresh');
    const joinedLater = await new Promise<string>((resolve) => {
      void scope.run(fakeTransaction('gone'), async () => {
        setTimeout(() => {
          void scope
            .join<string>(
              (work) => work(fresh),
              async (t) => (t as typeof fresh).name,
            )
            .then(resolve);
        }, 5);
      });
    });
    expect(joinedLater).toBe('fresh');
  });

  it('ends a nested run (one handler call of a claim) for what was started inside it, while the enclosing run of the same transaction goes on', async () => {
    const scope = new TransactionScope();
    const claim = fakeTransaction('claim');
    let releaseLeftBehind: () => void = () => undefined;
    const released = new Promise<void>((resolve) => (releaseLeftBehind = resolve));
    let leftBehind: Promise<StoreTransaction | undefined> = Promise.resolve(undefined);
    await scope.run(claim, async () => {
      await scope.run(claim, async () => {
        // Started by the call and not awaited (an event listener): it carries the call's context.
        leftBehind = (async () => {
          await released;
          return scope.active();
        })();
        expect(scope.active()).toBe(claim);
      });
      releaseLeftBehind();
      // The call is over, its transaction is not: only the enclosing run still joins it.
      await expect(leftBehind).resolves.toBeUndefined();
      expect(scope.active()).toBe(claim);
    });
  });
});
