// @ts-check
// The admin API, relative to the page (served at /<path>/, the API at /<path>/api/).

/** An answer that was not 2xx: the API's error code and message. */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   */
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

/**
 * `api/<segments…>`, each segment URL-encoded (channel names and ids come from the data).
 * @param {...string} segments
 */
export function apiPath(...segments) {
  return segments.map((segment) => encodeURIComponent(segment)).join('/');
}

/**
 * @param {string} path under api/, e.g. "sequences" or apiPath(...)
 * @param {Record<string, string | number | undefined>} [query] undefined values are left out;
 *   an empty string is sent (`?reason=` names the dead letters without a reason)
 * @returns {Promise<any>}
 */
export async function get(path, query = {}) {
  const url = new URL(`api/${path}`, document.baseURI);
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined) url.searchParams.set(name, String(value));
  }
  return answer(await fetch(url, { headers: { accept: 'application/json' } }));
}

/**
 * @param {string} path under api/
 * @param {unknown} body sent as JSON
 * @returns {Promise<any>}
 */
export async function post(path, body) {
  const url = new URL(`api/${path}`, document.baseURI);
  return answer(
    await fetch(url, {
      method: 'POST',
      headers: {
        accept: 'application/json',
        'content-type': 'application/json',
        'x-sequence-admin': '1',
      },
      body: JSON.stringify(body),
    }),
  );
}

/** @param {Response} response */
async function answer(response) {
  const text = await response.text();
  /** @type {any} */
  let data;
  try {
    data = text === '' ? undefined : JSON.parse(text);
  } catch {
    data = undefined;
  }
  if (response.ok) return data;
  const code = typeof data?.error === 'string' ? data.error : `http-${response.status}`;
  const message =
    typeof data?.message === 'string'
      ? data.message
      : Array.isArray(data?.message)
        ? data.message.join('; ')
        : `${response.status} ${response.statusText}`;
  throw new ApiError(response.status, code, message);
}
