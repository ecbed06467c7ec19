/** Types for `cluster-key-slot` (a dependency of ioredis), used by the store's tests. */
declare module 'cluster-key-slot' {
  /** The Redis Cluster hash slot of a key: CRC16 of its hash tag (or whole name), mod 16384. */
  function calculateSlot(key: string | Buffer): number;
  namespace calculateSlot {
    /** The slot shared by all keys, or -1 when they are in different slots. */
    function generateMulti(keys: ReadonlyArray<string | Buffer>): number;
  }
  export = calculateSlot;
}
