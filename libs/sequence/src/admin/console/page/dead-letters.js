// @ts-check
// Dead letters by channel and reason; the messages of a group on demand; replay and discard.
import { actionButton } from './actions.js';
import { apiPath, get } from './api.js';
import { h, table, Section } from './dom.js';
import { count, instant, size } from './format.js';
import { failure } from './overview.js';

/** How many dead letters of one group the page lists. */
const LIMIT = 50;
/** How the page shows the group of dead letters without a reason (the API's reason `""`). */
const NO_REASON = '(no reason)';
const section = new Section('dead-letters');
/** The groups whose messages are shown: "<channel>\n<reason>". */
const expanded = new Set();
/**
 * The channels the operator asked to group by reason. Where reading dead letters disturbs them
 * (RabbitMQ), the list of channels gives counts only; a grouping is read on request, and the
 * server reuses it for a while.
 */
const grouped = new Set();

/** @param {boolean} mutations */
export async function refreshDeadLetters(mutations) {
  try {
    const { channels = [] } = await get('dead-letters');
    const counted = channels.filter((/** @type {any} */ channel) => channel.total > 0);
    const open = await Promise.all(
      counted.map(async (/** @type {any} */ channel) =>
        channel.byReason || !grouped.has(channel.channel)
          ? channel
          : { ...channel, ...(await get(apiPath('dead-letters', channel.channel, 'reasons'))) },
      ),
    );
    /** @type {Record<string, any[]>} */
    const messages = {};
    await Promise.all(
      [...expanded].map(async (group) => {
        const [channel, reason] = group.split('\n');
        const still = open.some(
          (/** @type {any} */ c) =>
            c.channel === channel &&
            (c.byReason ?? []).some((/** @type {any} */ r) => r.reason === reason),
        );
        if (!still) return void expanded.delete(group);
        const { items = [] } = await get(apiPath('dead-letters', channel), {
          reason,
          limit: LIMIT,
        });
        messages[group] = items;
      }),
    );
    section.show({ open, messages, mutations }, () => render(open, messages));
  } catch (error) {
    section.unavailable(`Unavailable: ${failure(error)}`);
  }
}

/** @type {() => Promise<void>} */
let redraw = async () => {};
/** @param {() => Promise<void>} refresh */
export function onToggle(refresh) {
  redraw = refresh;
}

/**
 * @param {any[]} channels
 * @param {Record<string, any[]>} messages
 */
function render(channels, messages) {
  if (channels.length === 0) return [h('p', { class: 'none' }, 'No dead letter in any channel.')];
  return channels.map((channel) => {
    const name = String(channel.channel);
    const all = count(channel.total, 'dead letter');
    /** @type {string[] | undefined} Channels dead-lettering here: nothing can be replayed. */
    const sharedBy = channel.sharedBy;
    const where = sharedBy
      ? `${all} in ${channel.deadLetterChannel}, shared by ${sharedBy.join(', ')}`
      : `${all} in ${channel.deadLetterChannel}`;
    return h(
      'section',
      { class: 'channel', 'aria-label': `Dead letters of ${name}` },
      h('h3', {}, name, ' ', h('span', { class: 'sub' }, where)),
      sharedBy
        ? h(
            'p',
            { class: 'note' },
            `The dead letters of ${sharedBy.join(', ')} all go to ${channel.deadLetterChannel} ` +
              'and nothing in them says which channel each came from, so the console cannot ' +
              'replay them: republish each by hand to its own channel, or discard it. Give each ' +
              'handler a deadLetterChannel of its own to replay from here.',
          )
        : null,
      h(
        'div',
        { class: 'buttons bulk' },
        sharedBy
          ? null
          : actionButton({
              label: `Replay all ${channel.total}`,
              key: `dl-replay-all-${name}`,
              question: `Replay all ${all} of ${name} to ${name}?`,
              confirm: 'Replay all',
              path: apiPath('dead-letters', name, 'replay'),
              body: { all: true },
              describe: `Replay all dead letters of ${name}`,
            }),
        actionButton({
          label: `Discard all ${channel.total}`,
          key: `dl-discard-all-${name}`,
          question: `Discard all ${all} of ${name}? They are deleted for good.`,
          confirm: 'Discard all',
          path: apiPath('dead-letters', name, 'discard'),
          body: { all: true },
          describe: `Discard all dead letters of ${name}`,
          danger: true,
        }),
      ),
      channel.byReason
        ? table(
            `Dead letters of ${name} by reason`,
            ['Reason', 'Count', 'Actions'],
            channel.byReason.map((/** @type {any} */ group) => reasonRow(name, group, !sharedBy)),
          )
        : h(
            'button',
            {
              type: 'button',
              'data-key': `dl-group-${name}`,
              onclick: () => {
                grouped.add(name);
                void redraw();
              },
            },
            'Group by reason',
          ),
      ...(channel.byReason ?? [])
        .filter((/** @type {any} */ group) => expanded.has(`${name}\n${group.reason}`))
        .map((/** @type {any} */ group) =>
          messageTable(name, group.reason, messages[`${name}\n${group.reason}`] ?? [], !sharedBy),
        ),
    );
  });
}

/**
 * A reason as the page shows it.
 * @param {string} reason
 */
function shownReason(reason) {
  return reason === '' ? NO_REASON : reason;
}

/**
 * @param {string} channel
 * @param {any} group { reason, count }
 * @param {boolean} replayable false for a shared dead-letter channel
 */
function reasonRow(channel, group, replayable) {
  const reason = String(group.reason);
  const key = `${channel}\n${reason}`;
  const these = count(group.count, 'dead letter');
  const shown = reason === '' ? 'without a reason' : `with reason "${reason}"`;
  return [
    h('span', { class: 'reason' }, shownReason(reason)),
    String(group.count),
    h(
      'div',
      { class: 'buttons' },
      h(
        'button',
        {
          type: 'button',
          'data-key': `dl-show-${key}`,
          'aria-expanded': String(expanded.has(key)),
          onclick: () => {
            if (expanded.has(key)) expanded.delete(key);
            else expanded.add(key);
            void redraw();
          },
        },
        expanded.has(key) ? 'Hide messages' : 'Show messages',
      ),
      replayable
        ? actionButton({
            label: 'Replay group',
            key: `dl-replay-group-${key}`,
            question: `Replay ${these} of ${channel} ${shown} to ${channel}?`,
            confirm: 'Replay',
            path: apiPath('dead-letters', channel, 'replay'),
            body: { reason },
            describe: `Replay ${channel} dead letters "${shownReason(reason)}"`,
          })
        : null,
      actionButton({
        label: 'Discard group',
        key: `dl-discard-group-${key}`,
        question: `Discard ${these} of ${channel} ${shown}? They are deleted for good.`,
        confirm: 'Discard',
        path: apiPath('dead-letters', channel, 'discard'),
        body: { reason },
        describe: `Discard ${channel} dead letters "${shownReason(reason)}"`,
        danger: true,
      }),
    ),
  ];
}

/**
 * @param {string} channel
 * @param {string} reason
 * @param {any[]} items
 * @param {boolean} replayable false for a shared dead-letter channel
 */
function messageTable(channel, reason, items, replayable) {
  return table(
    `${channel}, "${shownReason(reason)}": ${items.length >= LIMIT ? `the oldest ${LIMIT}` : count(items.length, 'message')}`,
    ['Id', 'Dead-lettered', 'Bytes', 'Replays', 'Headers', 'Actions'],
    items.map((item) => [
      h('code', {}, String(item.id)),
      instant(item.deadLetteredAt),
      size(item.bytes),
      String(item.replays ?? 0),
      h(
        'details',
        {},
        h('summary', {}, 'Headers'),
        h('pre', { class: 'details' }, JSON.stringify(item.headers ?? {}, null, 2)),
      ),
      h(
        'div',
        { class: 'buttons' },
        replayable
          ? actionButton({
              label: 'Replay',
              key: `dl-replay-${channel}-${item.id}`,
              question: `Replay dead letter ${item.id} to ${channel}?`,
              confirm: 'Replay',
              path: apiPath('dead-letters', channel, 'replay'),
              body: { ids: [String(item.id)] },
              describe: `Replay dead letter ${item.id} of ${channel}`,
            })
          : null,
        actionButton({
          label: 'Discard',
          key: `dl-discard-${channel}-${item.id}`,
          question: `Discard dead letter ${item.id} of ${channel}? It is deleted for good.`,
          confirm: 'Discard',
          path: apiPath('dead-letters', channel, 'discard'),
          body: { ids: [String(item.id)] },
          describe: `Discard dead letter ${item.id} of ${channel}`,
          danger: true,
        }),
      ),
    ]),
  );
}
