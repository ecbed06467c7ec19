// Compiled in an application without ioredis, where it must fail: nest-sequence/redis needs its
// peer. See test/package.e2e-spec.ts.
import { redis } from 'nest-sequence/redis';

export const stores = redis('redis://127.0.0.1:6379');
