// @ts-check
// Mutations: whether they are on, the confirmation dialog, and the log of what each one did.
import { post, ApiError } from './api.js';
import { h } from './dom.js';
import { instant } from './format.js';

const state = { mutations: false, busy: false };
/** @type {() => Promise<void>} */
let afterAction = async () => {};

/** @param {() => Promise<void>} refresh what runs after each action, to show its effect */
export function onActionDone(refresh) {
  afterAction = refresh;
}

/** @param {boolean} enabled what api/overview says */
export function setMutations(enabled) {
  state.mutations = enabled;
  const note = /** @type {HTMLElement} */ (document.getElementById('mutations-note'));
  note.hidden = enabled;
  note.textContent = enabled
    ? ''
    : 'Read-only: actions (replay, discard, retry, skip, release) are turned off in this ' +
      "application. They are enabled by SequenceAdminModule's mutations option, together with " +
      'a guard that lets only operators in.';
}

export function mutationsEnabled() {
  return state.mutations;
}

/**
 * @typedef {object} Action
 * @property {string} label the button's text
 * @property {string} key stable across refreshes (keeps the focus), unique on the page
 * @property {string} question what the confirmation asks
 * @property {string} confirm the confirming button's text
 * @property {string} path under api/
 * @property {unknown} body
 * @property {string} describe what the log line starts with
 * @property {boolean} [danger] a destructive action (discard)
 */

/**
 * A button that asks for confirmation, posts the action, logs the answer and refreshes. Disabled,
 * with the reason, while mutations are off.
 * @param {Action} action
 */
export function actionButton(action) {
  const button = h(
    'button',
    {
      type: 'button',
      class: action.danger ? 'danger' : 'action',
      'data-key': action.key,
      disabled: !state.mutations,
      'aria-describedby': state.mutations ? undefined : 'mutations-note',
      title: state.mutations ? undefined : 'Read-only: mutations are off',
      onclick: () => void run(action),
    },
    action.label,
  );
  return button;
}

/** @param {Action} action */
async function run(action) {
  if (state.busy) return;
  if (!(await confirmed(action.question, action.confirm))) return;
  state.busy = true;
  try {
    const answer = await post(action.path, action.body);
    record(action.describe, describeAnswer(answer), answer?.changed === 0 ? 'nothing' : 'done');
  } catch (error) {
    const message =
      error instanceof ApiError ? `${error.code}: ${error.message}` : `failed: ${String(error)}`;
    record(action.describe, message, 'failed');
  } finally {
    state.busy = false;
  }
  await afterAction();
}

/** @param {any} answer a mutation's answer: { changed, message, done?, missing?, failed? } */
function describeAnswer(answer) {
  const changed = Number(answer?.changed ?? 0);
  const message = String(answer?.message ?? '');
  const failures = Array.isArray(answer?.failed) ? answer.failed : [];
  const failed = failures
    .map((/** @type {any} */ failure) => `${failure?.id}: ${failure?.error}`)
    .join('; ');
  const head = changed === 0 ? `nothing changed: ${message}` : `${changed} changed: ${message}`;
  return failed ? `${head} (failed: ${failed})` : head;
}

/**
 * @param {string} what
 * @param {string} outcome
 * @param {'done' | 'nothing' | 'failed'} kind
 */
export function record(what, outcome, kind) {
  const log = /** @type {HTMLElement} */ (document.getElementById('action-log'));
  log.prepend(
    h(
      'li',
      { class: `outcome-${kind}`, 'data-outcome': kind },
      h('time', {}, instant(Date.now())),
      ' ',
      h('strong', {}, what),
      ' — ',
      h('span', { class: 'answer' }, outcome),
    ),
  );
  while (log.children.length > 20) log.lastElementChild?.remove();
  const last = /** @type {HTMLElement} */ (document.getElementById('last-action'));
  last.dataset.outcome = kind;
  last.textContent = `${what}: ${outcome}`;
}

/**
 * Asks in the page's modal dialog; resolves true when confirmed.
 * @param {string} question
 * @param {string} confirmLabel
 * @returns {Promise<boolean>}
 */
function confirmed(question, confirmLabel) {
  const dialog = /** @type {HTMLDialogElement} */ (document.getElementById('confirm'));
  /** @type {HTMLElement} */ (document.getElementById('confirm-text')).textContent = question;
  /** @type {HTMLElement} */ (document.getElementById('confirm-ok')).textContent = confirmLabel;
  const opener = document.activeElement;
  return new Promise((resolve) => {
    dialog.returnValue = '';
    dialog.addEventListener(
      'close',
      () => {
        if (opener instanceof HTMLElement && opener.isConnected) opener.focus();
        resolve(dialog.returnValue === 'confirm');
      },
      { once: true },
    );
    dialog.showModal();
    /** @type {HTMLElement} */ (document.getElementById('confirm-cancel')).focus();
  });
}
