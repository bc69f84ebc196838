// The JSON API with the admin token. The token lives in sessionStorage (this tab only) and
// travels in the Authorization header, never in a URL.

const KEY = 'webhook-inbox.admin-token';

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let onUnauthorized = () => {};
/** Called when the server refuses the token: the page signs out and says why. */
export function whenUnauthorized(f) { onUnauthorized = f; }

/** Calls the API; answers the parsed JSON, or throws an ApiError with the SPEC's code. */
export async function api(path, { method = 'GET', body, tokenOverride } = {}) {
  const headers = { Accept: 'application/json' };
  const bearer = tokenOverride ?? token.get();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store', credentials: 'omit',
    });
  } catch (e) {
    throw new ApiError(0, 'network', `The server did not answer (${e.message}).`);
  }
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) {
    const code = data?.error ?? 'http_' + response.status;
    const message = data?.message ?? `The server answered ${response.status}.`;
    const error = new ApiError(response.status, code, message);
    if (response.status === 401 && tokenOverride === undefined) onUnauthorized(error);
    throw error;
  }
  return data;
}

/**
 * One path segment of an API call, for any text. A segment `.` or `..` is normalised away by
 * the browser before the request leaves (`/events/shop/../retry` is `POST /events/retry`, the
 * bulk retry), and so are `%2E` and `%2E%2E`: no escaping keeps them. The server refuses such
 * ids at ingest; one stored before that cannot be addressed from here, and is refused rather
 * than turned into another route. Every API path the dashboard builds from data goes through
 * here. (Links within the page are `#` fragments, which no browser normalises.)
 */
export function segment(text) {
  if (/^\.+$/.test(text)) {
    throw new ApiError(0, 'unaddressable',
      `"${text}" is made only of dots: a browser would drop it from the URL. Use the CLI for it.`);
  }
  return encodeURIComponent(text);
}

/** `/events/{source}/{event_id}` with both parts escaped. */
export function eventPath(source, eventId) {
  return `/events/${segment(source)}/${segment(eventId)}`;
}

/** A query string from the filled-in fields only. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, v);
  }
  const s = q.toString();
  return s ? `?${s}` : '';
}
