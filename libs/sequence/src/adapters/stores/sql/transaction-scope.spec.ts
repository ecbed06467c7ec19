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
});
