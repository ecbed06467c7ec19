import { InvalidPayloadRefError } from '../core/errors/invalid-payload-ref.error';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import type { ClaimCheckStores } from '../kernel/tokens';
import type { PayloadStore } from '../ports/payload-store.port';
import { ClaimsReader } from './claims.reader';

function readerOf(head: PayloadStore['head'], readTimeoutMs = 30_000): ClaimsReader {
  const store = { name: 's3', head } as unknown as PayloadStore;
  return new ClaimsReader(
    { store, stores: new Map([['s3', store]]) } as unknown as ClaimCheckStores,
    readTimeoutMs,
  );
}

/**
 * docs/console.md: `not-found` means deleted, expired, or never there. A store that cannot be
 * asked (down, its bucket gone) has not said so.
 */
describe('ClaimsReader.status', () => {
  it('says not-found for a ref the store could not have made', async () => {
    const reader = readerOf(async (ref) => {
      throw new InvalidPayloadRefError('s3', ref, 'not a ref of this store');
    });

    await expect(reader.status('../etc/passwd')).resolves.toEqual({
      ref: '../etc/passwd',
      status: 'not-found',
    });
  });

  it('says not-found when the store answers that it holds no such payload', async () => {
    const reader = readerOf(async (ref) => {
      throw new ClaimCheckNotFoundError('s3', ref);
    });

    await expect(reader.status('2f9c')).resolves.toEqual({ ref: '2f9c', status: 'not-found' });
  });

  it('fails, rather than saying not-found, when the store cannot be asked', async () => {
    const reader = readerOf(async () => {
      throw new Error('connect ECONNREFUSED 127.0.0.1:9000');
    });

    await expect(reader.status('2f9c')).rejects.toThrow('ECONNREFUSED');
  });

  it('fails with PayloadReadTimeoutError when the store does not answer within readTimeoutMs', async () => {
    const reader = readerOf(() => new Promise(() => undefined), 50);

    await expect(reader.status('2f9c')).rejects.toEqual(
      expect.objectContaining({ name: 'PayloadReadTimeoutError', waitingFor: 'head', ref: '2f9c' }),
    );
  });

  it('asks every store at once: one that does not answer delays no other that holds the ref', async () => {
    const info = { bytes: 3, createdAt: 1, expiresAt: 2, published: true, contentType: 'x/y' };
    const frozen = { name: 'frozen', head: () => new Promise(() => undefined) };
    const holding = { name: 'redis', head: async () => info };
    const reader = new ClaimsReader(
      {
        store: frozen,
        stores: new Map([
          ['frozen', frozen],
          ['redis', holding],
        ]),
      } as unknown as ClaimCheckStores,
      5_000,
    );
    const late = new Promise((resolve) => setTimeout(() => resolve('still asking'), 1_000));

    await expect(Promise.race([reader.status('2f9c'), late])).resolves.toMatchObject({
      ref: '2f9c',
      status: 'published',
      store: 'redis',
    });
  });

  it('fails with the failure of a store that could not be asked only once none holds the ref', async () => {
    const failing = {
      name: 'failing',
      head: async () => {
        throw new Error('connect ECONNREFUSED 127.0.0.1:9000');
      },
    };
    const answering = {
      name: 'redis',
      head: async (ref: string) => {
        await new Promise((resolve) => setTimeout(resolve, 20));
        throw new ClaimCheckNotFoundError('redis', ref);
      },
    };
    const reader = new ClaimsReader(
      {
        store: failing,
        stores: new Map([
          ['failing', failing],
          ['redis', answering],
        ]),
      } as unknown as ClaimCheckStores,
      60_000,
    );

    await expect(reader.status('2f9c')).rejects.toThrow('ECONNREFUSED');
  });
});
