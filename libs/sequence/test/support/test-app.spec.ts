import { Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { closeAll, createTestApp } from './test-app';

describe('createTestApp', () => {
  it('closes the app, then what it owns and its resources, last opened first', async () => {
    const closed: string[] = [];
    @Injectable()
    class Witness implements OnApplicationShutdown {
      onApplicationShutdown(): void {
        closed.push('app');
      }
    }
    const t = await createTestApp({
      sequence: {},
      providers: [Witness],
      logger: false,
      resources: [() => closed.push('first'), () => closed.push('second')],
    });
    t.own(() => closed.push('owned'));
    await t.close();
    expect(closed).toEqual(['app', 'owned', 'second', 'first']);
  });

  it('closes the resources, not what it would own, when the app fails to boot', async () => {
    const closed: string[] = [];
    await expect(
      createTestApp({
        sequence: { notAnOption: true } as never,
        logger: false,
        resources: [() => closed.push('first'), () => closed.push('second')],
      }),
    ).rejects.toThrow(/notAnOption/);
    expect(closed).toEqual(['second', 'first']);
  });
});

describe('closeAll', () => {
  it('runs every closer even when one fails, then throws its error', async () => {
    const closed: string[] = [];
    const failure = new Error('cannot close');
    await expect(
      closeAll([
        () => closed.push('first'),
        () => Promise.reject(failure),
        () => closed.push('third'),
      ]),
    ).rejects.toBe(failure);
    expect(closed).toEqual(['third', 'first']);
  });

  it('throws an AggregateError when several fail', async () => {
    const error = await closeAll([
      () => Promise.reject(new Error('a')),
      () => Promise.reject(new Error('b')),
    ]).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(AggregateError);
    expect((error as AggregateError).errors.map((each: Error) => each.message)).toEqual(['b', 'a']);
  });
});
