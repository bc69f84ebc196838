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

/** `/events/{source}/{event_id}` with both parts escaped. */
export function eventPath(source, eventId) {
  return `/events/${encodeURIComponent(source)}/${encodeURIComponent(eventId)}`;
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
