// @ts-check
// How the console writes numbers, sizes, durations and position lists. Pure functions.

/** How many ranges a position list shows before it says how many more there are. */
const MAX_RANGES = 12;

/**
 * Position ranges as the API gives them, as text: [[1, 4], [7, 7]] → "1–4, 7". Long lists end with
 * "…", as do lists the API cut short (`truncated`: the ranges cover fewer than `total` positions)
 * so that one sequence of 10,000 scattered fragments does not fill the page.
 * @param {readonly (readonly [number, number])[]} list
 * @param {number} [total] how many positions the list holds in all
 * @returns {string}
 */
export function ranges(list, total) {
  const parts = list
    .slice(0, MAX_RANGES)
    .map(([start, end]) => (start === end ? String(start) : `${start}–${end}`));
  const shown = list.reduce((sum, [start, end]) => sum + end - start + 1, 0);
  const cut = list.length > MAX_RANGES || (total !== undefined && total > shown);
  return cut ? `${parts.join(', ')}, …` : parts.join(', ');
}

/**
 * Bytes in binary units: 1536 → "1.5 KiB".
 * @param {number | null | undefined} bytes
 */
export function size(bytes) {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/**
 * A duration, its two largest units: 125000 → "2 min 5 s".
 * @param {number | null | undefined} ms
 */
export function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return '—';
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  const seconds = Math.floor(ms / 1000);
  const units = [
    ['d', 86400],
    ['h', 3600],
    ['min', 60],
    ['s', 1],
  ];
  /** @type {string[]} */
  const parts = [];
  let rest = seconds;
  for (const [name, length] of units) {
    const count = Math.floor(rest / Number(length));
    rest -= count * Number(length);
    if (count > 0 || parts.length > 0) parts.push(`${count} ${name}`);
    if (parts.length === 2) break;
  }
  return parts.filter((part) => !part.startsWith('0 ')).join(' ') || '0 s';
}

/**
 * A point in time as ISO 8601 (UTC), from ms since the epoch or an ISO string.
 * @param {number | string | null | undefined} value
 */
export function instant(value) {
  if (value === null || value === undefined || value === '') return '—';
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toISOString().replace('.000Z', 'Z');
}

/**
 * "1 dead letter", "3 dead letters".
 * @param {number} count
 * @param {string} noun
 * @param {string} [plural]
 */
export function count(count, noun, plural = `${noun}s`) {
  return `${count} ${count === 1 ? noun : plural}`;
}

/**
 * A percentage of a limit, or undefined without one: (800, 1000) → "80%".
 * @param {number | null | undefined} value
 * @param {number | null | undefined} limit
 */
export function percentOf(value, limit) {
  if (!limit || value === null || value === undefined) return undefined;
  return `${Math.round((value / limit) * 100)}%`;
}
