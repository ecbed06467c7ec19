// @ts-check
// Open sequences, resequencer gaps, and failed outbox and inbox rows.
import { actionButton } from './actions.js';
import { apiPath, get } from './api.js';
import { h, table, Section } from './dom.js';
import { count, duration, instant, ranges, size } from './format.js';
import { failure } from './overview.js';

const sequences = new Section('sequences');
const gaps = new Section('gaps');
const outbox = new Section('outbox');
const inbox = new Section('inbox');

/** @param {boolean} mutations part of what each table is drawn from (its buttons) */
export async function refreshTables(mutations) {
  await Promise.all([
    load(sequences, 'sequences', mutations, sequenceTable),
    load(gaps, apiPath('resequencer', 'gaps'), mutations, gapTable),
    load(outbox, apiPath('outbox', 'failed'), mutations, (items) => failedRows('outbox', items)),
    load(inbox, apiPath('inbox', 'failed'), mutations, (items) => failedRows('inbox', items)),
  ]);
}

/**
 * @param {Section} section
 * @param {string} path
 * @param {boolean} mutations
 * @param {(items: any[]) => import('./dom.js').Child[]} build
 */
async function load(section, path, mutations, build) {
  try {
    const { items = [] } = await get(path);
    section.show({ items, mutations }, () => build(items));
  } catch (error) {
    section.unavailable(`Unavailable: ${failure(error)}`);
  }
}

/** @param {any[]} items */
function sequenceTable(items) {
  if (items.length === 0) return [h('p', { class: 'none' }, 'No open sequence.')];
  return [
    table(
      `${count(items.length, 'open sequence')}, oldest first`,
      [
        'Sequence',
        'Channel',
        'Received',
        'Missing',
        'Fragments',
        'Bytes',
        'Age',
        'Expires',
        'Lease holder',
      ],
      [...items]
        .sort((a, b) => (b.ageMs ?? 0) - (a.ageMs ?? 0))
        .map((item) => [
          h('code', {}, String(item.sequenceId)),
          String(item.channel),
          ranges(item.received ?? [], item.receivedCount) || 'none',
          missing(item),
          item.declaredFragments === null || item.declaredFragments === undefined
            ? 'not declared yet'
            : String(item.declaredFragments),
          size(item.bytes),
          duration(item.ageMs),
          instant(item.deadlineAt),
          item.leaseHolder
            ? String(item.leaseHolder)
            : item.complete
              ? 'none'
              : 'none (incomplete)',
        ]),
    ),
  ];
}

/** @param {any} item an open sequence */
function missing(item) {
  const list = item.missing ?? [];
  if (item.complete) return 'none: complete, its handler is running';
  if (list.length > 0) return h('span', { class: 'missing' }, ranges(list, item.missingCount));
  return item.declaredFragments === null || item.declaredFragments === undefined
    ? 'none so far (the size is not known yet)'
    : 'none';
}

/** @param {any[]} items */
function gapTable(items) {
  if (items.length === 0) return [h('p', { class: 'none' }, 'No open gap: every key is in order.')];
  return [
    table(
      `${count(items.length, 'open gap')}`,
      ['Key', 'Resequencer', 'Waiting for', 'Held behind it', 'Since', 'Waiting', 'Actions'],
      items.map((gap) => {
        const target = `key ${gap.key} of ${gap.resequencer}`;
        const path = (/** @type {string} */ verb) =>
          apiPath('resequencer', 'gaps', String(gap.resequencer), String(gap.key), verb);
        return [
          h('code', {}, String(gap.key)),
          String(gap.resequencer),
          `seq ${gap.expected}`,
          gap.lowest === undefined ? String(gap.held) : `${gap.held} (from seq ${gap.lowest})`,
          instant(gap.since),
          gap.timeoutMs !== undefined && gap.ageMs > gap.timeoutMs
            ? `${duration(gap.ageMs)} (overdue: timeout ${duration(gap.timeoutMs)})`
            : duration(gap.ageMs),
          h(
            'div',
            { class: 'buttons' },
            actionButton({
              label: 'Skip gap',
              key: `gap-skip-${gap.resequencer}-${gap.key}`,
              question: `Skip seq ${gap.expected} for ${target}? It will never be delivered, and what is held behind it goes on.`,
              confirm: 'Skip the gap',
              path: path('skip'),
              // Only the gap shown: one that opened after the page looked is left alone.
              body: { since: gap.since },
              describe: `Skip the gap of ${target}`,
              danger: true,
            }),
            actionButton({
              label: 'Release held',
              key: `gap-release-${gap.resequencer}-${gap.key}`,
              question: `Release what is held behind seq ${gap.expected} for ${target}, without waiting for it?`,
              confirm: 'Release',
              path: path('release'),
              body: { since: gap.since },
              describe: `Release what is held for ${target}`,
            }),
          ),
        ];
      }),
    ),
  ];
}

/**
 * @param {'outbox' | 'inbox'} box
 * @param {any[]} items
 */
function failedRows(box, items) {
  const what = box === 'outbox' ? 'failed outbox row' : 'failed inbox row';
  if (items.length === 0) return [h('p', { class: 'none' }, `No ${what}.`)];
  const ids = items.map((item) => String(item.id));
  const retry = box === 'outbox' ? 'publish it again' : 'run its handler again';
  return [
    h(
      'div',
      { class: 'buttons bulk' },
      actionButton({
        label: `Retry all ${ids.length}`,
        key: `${box}-retry-all`,
        question: `Retry ${count(ids.length, what)} (${retry})?`,
        confirm: 'Retry',
        path: apiPath(box, 'retry'),
        body: { ids },
        describe: `Retry ${count(ids.length, what)}`,
      }),
      actionButton({
        label: `Discard all ${ids.length}`,
        key: `${box}-discard-all`,
        question: `Discard ${count(ids.length, what)}? They are deleted for good.`,
        confirm: 'Discard',
        path: apiPath(box, 'discard'),
        body: { ids },
        describe: `Discard ${count(ids.length, what)}`,
        danger: true,
      }),
    ),
    table(
      `${count(items.length, what)}`,
      ['Id', 'Type', 'Table', 'Attempts', 'Last error', 'Last attempt', 'Actions'],
      items.map((item) => [
        h('code', {}, String(item.id)),
        [item.kind, item.type].filter(Boolean).join(' '),
        String(item.channel ?? ''),
        String(item.attempts ?? ''),
        h('span', { class: 'error' }, String(item.lastError ?? '')),
        instant(item.failedAt),
        h(
          'div',
          { class: 'buttons' },
          actionButton({
            label: 'Retry',
            key: `${box}-retry-${item.channel}-${item.id}`,
            question: `Retry ${box} row ${item.id} (${retry})?`,
            confirm: 'Retry',
            path: apiPath(box, 'retry'),
            // The row's table: another table of the box may hold a failed row with the same id.
            body: { ids: [String(item.id)], channel: String(item.channel) },
            describe: `Retry ${box} row ${item.id}`,
          }),
          actionButton({
            label: 'Discard',
            key: `${box}-discard-${item.channel}-${item.id}`,
            question: `Discard ${box} row ${item.id}? It is deleted for good.`,
            confirm: 'Discard',
            path: apiPath(box, 'discard'),
            body: { ids: [String(item.id)], channel: String(item.channel) },
            describe: `Discard ${box} row ${item.id}`,
            danger: true,
          }),
        ),
      ]),
      (row, index) => `${box}-${ids[index]}`,
    ),
  ];
}
