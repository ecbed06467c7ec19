// @ts-check
// Building the page's markup. Data only ever becomes text nodes and attribute values, never HTML.

/**
 * @typedef {Node | string | number | null | undefined | false} Child
 * @typedef {Record<string, string | number | boolean | null | undefined | EventListener>} Attributes
 */

/**
 * An element with attributes and children. Strings become text nodes; `on…` attributes take
 * listener functions only.
 * @param {string} tag
 * @param {Attributes} [attributes]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElement}
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) {
      if (typeof value !== 'function') throw new Error(`${name} takes a function`);
      element.addEventListener(name.slice(2), value);
    } else if (typeof value === 'function') {
      throw new Error(`${name} does not take a function`);
    } else {
      element.setAttribute(name, value === true ? '' : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(typeof child === 'number' ? String(child) : child);
  }
  return element;
}

/**
 * A table with a caption and column headers; each row is a list of cells.
 * @param {string} caption
 * @param {string[]} columns
 * @param {Child[][]} rows
 * @param {(row: Child[], index: number) => string} [rowKey] a stable key, for the row's data-row
 */
export function table(caption, columns, rows, rowKey) {
  return h(
    'table',
    {},
    h('caption', {}, caption),
    h('thead', {}, h('tr', {}, ...columns.map((column) => h('th', { scope: 'col' }, column)))),
    h(
      'tbody',
      {},
      ...rows.map((row, index) =>
        h(
          'tr',
          { 'data-row': rowKey?.(row, index) },
          ...row.map((cell, column) =>
            column === 0 ? h('th', { scope: 'row' }, cell) : h('td', {}, cell),
          ),
        ),
      ),
    ),
  );
}

/**
 * Replaces a container's content, keeping the keyboard focus: an element that had it (found
 * again by its data-key) gets it back, so that a refresh never throws the user out of a table.
 * @param {HTMLElement} container
 * @param {...Child} nodes
 */
export function replace(container, ...nodes) {
  const active = document.activeElement;
  const key =
    active instanceof HTMLElement && container.contains(active) ? active.dataset.key : undefined;
  container.replaceChildren(
    ...nodes
      .filter(
        /** @returns {node is Node | string} */
        (node) => node !== null && node !== undefined && node !== false,
      )
      .map((node) => (typeof node === 'number' ? String(node) : node)),
  );
  if (key === undefined) return;
  const again = container.querySelector(`[data-key="${CSS.escape(key)}"]`);
  if (again instanceof HTMLElement) again.focus();
}

/**
 * Renders a section only when its data changed since the last time, so that an unchanged
 * refresh touches nothing (no lost focus, selection or scroll position).
 */
export class Section {
  /** @param {string} id the container's id */
  constructor(id) {
    const element = document.getElementById(id);
    if (!element) throw new Error(`no #${id} on the page`);
    /** @type {HTMLElement} */
    this.element = element;
    /** @type {string | undefined} */
    this.shown = undefined;
  }

  /**
   * @param {unknown} data what the content is built from, compared with the last time
   * @param {() => Child[]} build
   */
  show(data, build) {
    const fingerprint = JSON.stringify(data);
    if (fingerprint === this.shown) return;
    this.shown = fingerprint;
    replace(this.element, ...build());
  }

  /** @param {string} message */
  unavailable(message) {
    this.show({ unavailable: message }, () => [h('p', { class: 'unavailable' }, message)]);
  }
}
