// @ts-check
// The top of the page: problems first, then each pattern's state at a glance, and the lookups.
import { apiPath, get, ApiError } from './api.js';
import { h, replace, table, Section } from './dom.js';
import { count, duration, instant, percentOf, size } from './format.js';

const problems = new Section('problems');
const glance = new Section('glance');

/** @param {any} overview api/overview */
export function showOverview(overview) {
  problems.show(overview.problems, () => problemList(overview.problems ?? []));
  glance.show(overview, () => cards(overview));
}

/** @param {string} message */
export function overviewUnavailable(message) {
  problems.unavailable(`Cannot read the overview: ${message}`);
  glance.unavailable('');
}

/** @param {any[]} list */
function problemList(list) {
  if (list.length === 0) {
    return [h('p', { class: 'all-clear' }, 'No problems: nothing failed and nothing is overdue.')];
  }
  const ordered = [...list].sort(
    (a, b) => Number(b.severity === 'critical') - Number(a.severity === 'critical'),
  );
  return [
    h(
      'ul',
      { class: 'problems' },
      ...ordered.map((problem, index) =>
        h(
          'li',
          { class: `problem ${problem.severity === 'critical' ? 'critical' : 'warning'}` },
          h(
            'span',
            { class: 'severity' },
            problem.severity === 'critical' ? 'Critical' : 'Warning',
          ),
          ' ',
          h('span', { class: 'pattern' }, String(problem.pattern ?? '')),
          ' ',
          h('span', { class: 'message' }, String(problem.message ?? '')),
          problem.target
            ? h(
                'button',
                {
                  type: 'button',
                  class: 'link',
                  'data-key': `problem-find-${index}`,
                  onclick: () => void find(String(problem.target)),
                },
                `Find ${problem.target}`,
              )
            : null,
        ),
      ),
    ),
  ];
}

/**
 * @param {string} title
 * @param {boolean} attention
 * @param {[string, string][]} facts
 */
function card(title, attention, facts) {
  return h(
    'section',
    { class: `card ${attention ? 'attention' : 'ok'}`, 'aria-label': title },
    h('h3', {}, title, ' ', h('span', { class: 'badge' }, attention ? 'needs attention' : 'OK')),
    h('dl', {}, ...facts.flatMap(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
  );
}

/** @param {any} overview */
function cards(overview) {
  const sequences = overview.sequences ?? {};
  const deadLetters = overview.deadLetters ?? {};
  const resequencer = overview.resequencer ?? {};
  const outbox = overview.outbox ?? {};
  const inbox = overview.inbox ?? {};
  const share = percentOf(sequences.storedBytes, sequences.limitBytes);
  return [
    card(
      'Message Sequence',
      (overview.problems ?? []).some((/** @type {any} */ p) => p.pattern === 'sequence'),
      [
        ['Open sequences', String(sequences.open ?? 0)],
        ['Oldest open', duration(sequences.oldestAgeMs)],
        [
          'Stored',
          `${size(sequences.storedBytes)}${share ? ` (${share} of ${size(sequences.limitBytes)})` : ''}`,
        ],
        ['Reserved', size(sequences.reservedBytes)],
      ],
    ),
    card(
      'Dead letters',
      (deadLetters.total ?? 0) > 0,
      deadLetters.supported === false
        ? [['Dead letters', 'not browsable on this transport']]
        : [
            ['Dead letters', String(deadLetters.total ?? 0)],
            ['Channels with dead letters', String(deadLetters.channels ?? 0)],
          ],
    ),
    card('Resequencer', (resequencer.openGaps ?? 0) > 0, [
      ['Open gaps', String(resequencer.openGaps ?? 0)],
      ['Oldest gap', duration(resequencer.oldestGapAgeMs)],
    ]),
    card('Outbox and inbox', (outbox.failed ?? 0) > 0 || (inbox.failed ?? 0) > 0, [
      ['Outbox', `${outbox.pending ?? 0} pending, ${outbox.failed ?? 0} failed`],
      ['Outbox lag', duration(outbox.lagMs)],
      ['Inbox', `${inbox.pending ?? 0} pending, ${inbox.failed ?? 0} failed`],
    ]),
  ];
}

/**
 * Looks an id up everywhere (api/find/:id) and shows the matches.
 * @param {string} id
 */
export async function find(id) {
  const input = /** @type {HTMLInputElement} */ (document.getElementById('find-id'));
  input.value = id;
  const result = /** @type {HTMLElement} */ (document.getElementById('find-result'));
  replace(result, h('p', {}, `Looking for ${id}…`));
  try {
    const { matches = [] } = await get(apiPath('find', id));
    if (matches.length === 0) {
      replace(result, h('p', { class: 'none' }, `Nothing found for ${id}.`));
      return;
    }
    replace(
      result,
      table(
        `${count(matches.length, 'match', 'matches')} for ${id}`,
        ['Kind', 'Summary', 'Details'],
        matches.map((/** @type {any} */ match) => [
          String(match.kind),
          String(match.summary ?? ''),
          details(match, ['kind', 'summary']),
        ]),
      ),
    );
  } catch (error) {
    replace(result, h('p', { class: 'unavailable' }, failure(error)));
  }
}

/** @param {string} ref */
async function lookUpClaim(ref) {
  const result = /** @type {HTMLElement} */ (document.getElementById('claim-result'));
  replace(result, h('p', {}, `Looking up ${ref}…`));
  try {
    const claim = await get(apiPath('claims', ref));
    const facts = [
      ['Ref', String(claim.ref)],
      ['Status', String(claim.status)],
      ['Size', size(claim.bytes)],
      ['Created', instant(claim.createdAt)],
      ['Expires', instant(claim.expiresAt)],
    ];
    if (claim.checkedOut !== undefined)
      facts.push(['Checked out', JSON.stringify(claim.checkedOut)]);
    replace(
      result,
      h(
        'dl',
        { class: `claim status-${claim.status}` },
        ...facts.flatMap(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]),
      ),
    );
  } catch (error) {
    replace(result, h('p', { class: 'unavailable' }, failure(error)));
  }
}

/**
 * The fields of an object beyond the ones already shown, as "name: value" lines.
 * @param {Record<string, unknown>} item
 * @param {string[]} skip
 */
export function details(item, skip) {
  const lines = Object.entries(item)
    .filter(([name]) => !skip.includes(name))
    .map(
      ([name, value]) => `${name}: ${typeof value === 'string' ? value : JSON.stringify(value)}`,
    );
  return h('pre', { class: 'details' }, lines.join('\n'));
}

/** @param {unknown} error */
export function failure(error) {
  return error instanceof ApiError ? `${error.message} (${error.code})` : String(error);
}

export function wireLookups() {
  const findForm = /** @type {HTMLFormElement} */ (document.getElementById('find-form'));
  findForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const id = String(new FormData(findForm).get('id') ?? '').trim();
    if (id) void find(id);
  });
  const claimForm = /** @type {HTMLFormElement} */ (document.getElementById('claim-form'));
  claimForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const ref = String(new FormData(claimForm).get('ref') ?? '').trim();
    if (ref) void lookUpClaim(ref);
  });
}
