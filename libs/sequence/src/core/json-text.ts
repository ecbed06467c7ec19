/**
 * `JSON.stringify(value)`, refusing what JSON would carry as an empty object: a Map or a Set, at
 * any depth, whose entries would be lost without a word.
 * @throws TypeError naming the property that holds a Map or a Set; and as `JSON.stringify` for a
 * BigInt or a cycle
 */
export function jsonText(value: unknown): string | undefined {
  return JSON.stringify(value, refuseCollections);
}

function refuseCollections(key: string, value: unknown): unknown {
  if (value instanceof Map || value instanceof Set) {
    const what = value instanceof Map ? 'a Map' : 'a Set';
    const where = key === '' ? 'the data' : `the property ${JSON.stringify(key)}`;
    const instead = value instanceof Map ? 'Object.fromEntries(map)' : '[...set]';
    throw new TypeError(
      `${where} is ${what}, which JSON would send as {}: send ${instead} instead`,
    );
  }
  return value;
}
