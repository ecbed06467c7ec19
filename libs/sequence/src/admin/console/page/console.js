// @ts-check
// The console's entry point: reads the API every few seconds and redraws what changed.
import { onActionDone, setMutations, mutationsEnabled } from './actions.js';
import { get } from './api.js';
import { onToggle, refreshDeadLetters } from './dead-letters.js';
import { instant } from './format.js';
import { failure, overviewUnavailable, showOverview, wireLookups } from './overview.js';
import { refreshTables } from './tables.js';

const REFRESH_MS = 5000;
const status = /** @type {HTMLElement} */ (document.getElementById('refresh-status'));
const auto = /** @type {HTMLInputElement} */ (document.getElementById('auto-refresh'));
/** @type {Promise<void> | undefined} */
let running;
/** @type {ReturnType<typeof setTimeout> | undefined} */
let timer;

/** One refresh at a time; a request made while one runs waits for it, then runs again. */
function refresh() {
  const next = (running ?? Promise.resolve()).then(readAll);
  running = next.finally(() => {
    if (running === next) running = undefined;
  });
  return next;
}

async function readAll() {
  clearTimeout(timer);
  try {
    const overview = await get('overview');
    setMutations(Boolean(overview.mutations));
    showOverview(overview);
  } catch (error) {
    overviewUnavailable(failure(error));
  }
  const mutations = mutationsEnabled();
  await Promise.all([refreshTables(mutations), refreshDeadLetters(mutations)]);
  document.body.dataset.refreshed = String(Date.now());
  status.textContent = `Updated ${instant(Date.now())}${auto.checked ? `, every ${REFRESH_MS / 1000} s` : ', paused'}`;
  schedule();
}

function schedule() {
  clearTimeout(timer);
  if (auto.checked) timer = setTimeout(() => void refresh(), REFRESH_MS);
}

onActionDone(refresh);
onToggle(refresh);
wireLookups();
auto.addEventListener('change', () => {
  schedule();
  status.textContent = auto.checked ? 'Refreshing every 5 s' : 'Paused';
});
/** @type {HTMLElement} */ (document.getElementById('refresh-now')).addEventListener(
  'click',
  () => void refresh(),
);
document.addEventListener('visibilitychange', () => {
  if (!document.hidden) void refresh();
});
void refresh();
