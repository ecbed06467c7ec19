import { MAX_PARTITIONS, partitionIndex, partitionsProblem } from './partition';

describe('partitionIndex', () => {
  it('is the CRC-32 of the key modulo the count, the same in every process', () => {
    // zlib.crc32('123456789') is the standard check value 0xCBF43926.
    expect(partitionIndex('123456789', 256)).toBe(0xcbf43926 % 256);
    expect(partitionIndex('123456789', 7)).toBe(0xcbf43926 % 7);
    expect(partitionIndex('123456789', 1)).toBe(0);
  });

  it('spreads keys over every partition', () => {
    const seen = new Set<number>();
    for (let i = 0; i < 1000; i++) seen.add(partitionIndex(`sequence-${i}`, 8));
    expect([...seen].sort()).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it.each([0, -1, 1.5, MAX_PARTITIONS + 1, Number.NaN])('refuses %p partitions', (count) => {
    expect(() => partitionIndex('a', count)).toThrow(RangeError);
    expect(partitionsProblem(count)).toMatch(/partitions must be an integer from 1 to 256/);
  });
});
