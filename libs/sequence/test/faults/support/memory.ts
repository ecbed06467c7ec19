import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** Heap plus ArrayBuffer memory (Buffers) still referenced, after a full collection. */
export function retainedMemory(): () => Promise<number> {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  return async () => {
    gc();
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    const { heapUsed, arrayBuffers } = process.memoryUsage();
    return heapUsed + arrayBuffers;
  };
}
