import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * Buffer (ArrayBuffer) memory still referenced, after a full collection: where message bodies
 * live. The JS heap is left out: in a suite run in band it swings by more than 15 MB with what
 * the files before left behind, more than any bound a test could set on it.
 */
export function retainedBufferMemory(): () => Promise<number> {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  return async () => {
    gc();
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    return process.memoryUsage().arrayBuffers;
  };
}
