import { createReadStream } from 'node:fs';
import { destroySource } from './refused-source';

describe('destroySource', () => {
  // A path-based file stream opens after it is made: destroyed before that, it still reports
  // its failure to open, as an 'error' nobody else listens to (an uncaught exception).
  it.each([
    ['a stream', (stream: NodeJS.ReadableStream) => stream],
    ['the records of a record source', (stream: NodeJS.ReadableStream) => ({ records: stream })],
  ])('destroys %s that fails to open without an uncaught error', async (_, source) => {
    const stream = createReadStream('/nonexistent/nest-sequence/refused-source');
    const uncaught: unknown[] = [];
    let ended!: () => void;
    // An uncaught 'error' ends the stream's teardown before its 'close'.
    const end = new Promise<void>((resolve) => (ended = resolve));
    const onUncaught = (error: unknown) => {
      uncaught.push(error);
      ended();
    };
    const jestListeners = process.listeners('uncaughtException');
    process.removeAllListeners('uncaughtException');
    process.on('uncaughtException', onUncaught);
    try {
      destroySource(source(stream));
      stream.on('close', () => ended());
      await end;
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.removeListener('uncaughtException', onUncaught);
      for (const listener of jestListeners) process.on('uncaughtException', listener);
    }
    expect(stream.destroyed).toBe(true);
    expect(uncaught).toEqual([]);
  });
});
