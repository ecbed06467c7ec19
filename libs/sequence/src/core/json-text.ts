/**
 * `JSON.stringify(value)`, refusing what JSON would carry as an empty object, at any depth: a Map
 * or a Set, whose entries would be lost without a word; a Promise (or another thenable), whose
 * value was not awaited; an async iterable (an async generator, a web `ReadableStream`), whose
 * chunks would never be read.
 * @throws TypeError naming the property that holds one; and as `JSON.stringify` for a BigInt or
 * a cycle
 */
export function jsonText(value: unknown): string | undefined {
  return JSON.stringify(value, refuseLostValues);
}

function refuseLostValues(key: string, value: unknown): unknown {
  if (typeof value !== 'object' || value === null) return value;
  const lost = lostAsJson(value);
  if (lost) {
    const where = key === '' ? 'the data' : `the property ${JSON.stringify(key)}`;
    throw new TypeError(`${where} is ${lost.what}, which JSON would send as {}: ${lost.instead}`);
  }
  return value;
}

function lostAsJson(value: object): { what: string; instead: string } | undefined {
  if (value instanceof Map)
    return { what: 'a Map', instead: 'send Object.fromEntries(map) instead' };
  if (value instanceof Set) return { what: 'a Set', instead: 'send [...set] instead' };
  const members = value as Partial<Record<string | symbol, unknown>>;
  if (typeof members.then === 'function') {
    return { what: 'a Promise', instead: 'await it first' };
  }
  if (typeof members[Symbol.asyncIterator] === 'function') {
    return {
      what: 'an async iterable',
      instead: 'send Readable.from(it) for its bytes, or the values it yields',
    };
  }
  return undefined;
}
