// Loyalty balance by customer; submission requests: the submitted ones listed through their
// events (source `requests`, event id = request id), any one shown by id; and deliveries
// refused at the edge (GET /rejections), filtered through the URL like the event list
// (`#rejected?reason=invalid_signature`), each row opening onto its headers and body digest.
// Everything in a refusal came from whoever sent it: it only ever becomes text.

import { api, query, segment } from './api.js';
import { h, $, clear, time, say, statusBadge, localInput, utcOf, clipped } from './dom.js';

function table(caption, heads, rows) {
  return h('table', { class: 'cards-on-phone' },
    h('caption', { text: caption }),
    h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col', text: t })))),
    h('tbody', {}, rows.map((cells) => h('tr', {},
      cells.map((c, i) => h('td', { 'data-label': heads[i] }, c))))));
}

async function lookUpLoyalty(e) {
  e.preventDefault();
  const customer = $('customer').value.trim();
  const out = $('loyalty-result');
  if (!customer) return;
  try {
    const a = await api(`/loyalty/${segment(customer)}`);
    clear(out,
      h('p', { class: 'big' }, 'Customer ', h('span', { class: 'mono', text: a.customer_id }),
        `: ${a.balance} point${a.balance === 1 ? '' : 's'}`),
      a.credits.length
        ? table('Credits, one per order', ['Order', 'Points', 'Event'], a.credits.map((c) => [
          h('span', { class: 'mono', text: c.order_id }), String(c.points),
          h('a', { href: `#event/${encodeURIComponent(c.source)}/${encodeURIComponent(c.event_id)}`, class: 'mono', text: `${c.source}/${c.event_id}` }),
        ]))
        : h('p', { class: 'muted', text: 'No credits: the balance is 0.' }));
  } catch (err) {
    clear(out, h('p', { class: 'error', role: 'alert', text: `Lookup failed: ${err.message}` }));
  }
}

export async function showRequest(id) {
  const out = $('request-result');
  $('request-id').value = id;
  try {
    const r = await api(`/requests/${segment(id)}`);
    const ev = r.event;
    clear(out,
      h('h2', {}, 'Request ', h('span', { class: 'mono', text: r.id })),
      h('dl', { class: 'fields' },
        h('dt', { text: 'Status' }), h('dd', { text: r.status }),
        h('dt', { text: 'Submission event' }),
        h('dd', {}, ev
          ? [statusBadge(ev), ev.outcome ? ` outcome ${ev.outcome}` : '',
            ev.last_error ? h('span', { class: 'error-text', text: ` ${ev.last_error}` }) : '', ' ',
            h('a', { href: `#event/requests/${encodeURIComponent(r.id)}`, text: 'open the event' })]
          : 'none yet: the request is a draft')),
      r.documents.length
        ? table('Documents', ['Name', 'Content type', 'Size (bytes)', 'ID'], r.documents.map((d) => [
          d.name, d.content_type, String(d.size), h('span', { class: 'mono', text: d.id })]))
        : h('p', { class: 'muted', text: 'No documents.' }));
  } catch (err) {
    clear(out, h('p', { class: 'error', role: 'alert', text: `Could not show the request: ${err.message}` }));
  }
}

let cursor = null;

async function loadRequests(more) {
  const status = $('requests-status');
  if (!more) { cursor = null; clear($('requests-body')); }
  try {
    const page = await api('/events' + query({ source: 'requests', limit: 50, cursor: more ? cursor : null }));
    $('requests-body').append(...page.events.map((e) => h('tr', {},
      h('td', { 'data-label': 'Request ID' },
        h('a', { href: `#request/${encodeURIComponent(e.event_id)}`, class: 'mono', text: e.event_id })),
      h('td', { 'data-label': 'Submission status' }, statusBadge(e)),
      h('td', { 'data-label': 'Last error' }, e.last_error ? h('span', { class: 'error-text', text: e.last_error }) : '—'),
      h('td', { 'data-label': 'Submitted' }, time(e.received_at)))));
    cursor = page.next_cursor;
    $('requests-more').hidden = !cursor;
    const n = $('requests-body').children.length;
    say(status, n ? `${n} submitted request${n === 1 ? '' : 's'} shown.` : 'No request has been submitted yet.');
  } catch (err) {
    say(status, `Could not list requests: ${err.message}`, true);
  }
}

export function showRequests() { return loadRequests(false); }

// Refused deliveries.

const REJECTED_PAGE = 50;
const REJECTED_KEYS = ['source', 'reason', 'received_after', 'received_before'];
const REJECTED_LABELS = ['Received', 'Source', 'Reason', 'Status', 'Sender', 'Body', 'Message'];
const NONE_KEPT = 'Deliveries refused at the edge: bad signature, stale timestamp, unknown ' +
  'source, oversize, bad body, forbidden sender. None kept yet.';
let rejectedCursor = null;
let rejectedLoading = 0; // a generation counter: a slow answer for old filters is dropped

/** The filters as the API takes them; local date-times become RFC 3339 UTC. */
function rejectedFilters() {
  const form = $('rejected-filters');
  return {
    source: form.source.value.trim(),
    reason: form.reason.value.trim(),
    received_after: utcOf(form.received_after.value),
    received_before: utcOf(form.received_before.value),
  };
}

/** `#rejected?reason=invalid_signature`; `#rejected` alone is every kept refusal. */
function rejectedHash(f) {
  const q = new URLSearchParams();
  for (const k of REJECTED_KEYS) if (f[k]) q.set(k, f[k]);
  const s = q.toString();
  return s ? `#rejected?${s}` : '#rejected';
}

function fillRejectedForm(search) {
  const q = new URLSearchParams(search ?? '');
  const form = $('rejected-filters');
  form.source.value = q.get('source') ?? '';
  form.reason.value = q.get('reason') ?? '';
  form.received_after.value = localInput(q.get('received_after'));
  form.received_before.value = localInput(q.get('received_before'));
}

/** Applying filters changes the URL; the router then shows (and loads) that URL. */
function applyRejected() {
  const hash = rejectedHash(rejectedFilters());
  if (location.hash === hash) loadRejected(false);
  else location.hash = hash;
}

/** `512 B`, `4.9 KiB`: the exact count is in the title. */
function size(bytes) {
  if (bytes === null || bytes === undefined) return h('span', { class: 'muted', text: '—' });
  const text = bytes < 1024 ? `${bytes} B`
    : bytes < 1024 * 1024 ? `${(bytes / 1024).toFixed(1)} KiB`
      : `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
  return h('span', { class: 'size', title: `${bytes} byte${bytes === 1 ? '' : 's'}`, text });
}

function rejectedCell(i, ...children) {
  return h('td', { 'data-label': REJECTED_LABELS[i] }, ...children);
}

/** What the row opens onto: every header the request had, and what is known of its body. */
function rejectionDetail(r) {
  const names = Object.keys(r.headers ?? {}).sort();
  const field = (label, ...value) => [h('dt', { text: label }), h('dd', {}, ...value)];
  let body;
  if (r.body_bytes === null || r.body_bytes === undefined) body = 'unknown: no Content-Length, not read';
  else if (r.body_sha256) body = `${r.body_bytes} byte${r.body_bytes === 1 ? '' : 's'}`;
  else body = `${r.body_bytes} byte${r.body_bytes === 1 ? '' : 's'} as declared in Content-Length (the body was not read)`;
  return h('div', { class: 'rejection-detail' },
    h('dl', { class: 'fields compact' },
      field('Refusal', h('span', { class: 'mono', text: `#${r.id}` })),
      field('Received', time(r.received_at)),
      field('Answer', h('span', { class: 'mono', text: `${r.status} ${r.reason}` })),
      field('Body size', body),
      field('Body SHA-256', r.body_sha256
        ? h('span', { class: 'mono sha', text: r.body_sha256 })
        : h('span', { class: 'muted', text: 'none: the body was not read' }))),
    names.length
      ? h('table', { class: 'headers cards-on-phone' },
        h('caption', { text: `Headers as received (${names.length})` }),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'Name' }), h('th', { scope: 'col', text: 'Value' }))),
        h('tbody', {}, names.map((name) => {
          const value = r.headers[name];
          return h('tr', { 'data-header': name },
            h('td', { 'data-label': 'Name' }, h('span', { class: 'mono', text: name })),
            h('td', { 'data-label': 'Value' }, value === null
              ? h('span', { class: 'muted not-kept', title: 'It may hold a secret, so only its name is kept', text: '(not kept)' })
              : h('span', { class: 'mono', text: String(value) })));
        })))
      : h('p', { class: 'muted', text: 'The request had no headers.' }));
}

/** Two rows: the refusal, and its details (hidden until its button opens them). */
function rejectionRows(r) {
  const detailId = `rejection-${r.id}-detail`;
  const detail = h('tr', { class: 'detail-row', id: detailId, hidden: true },
    h('td', { class: 'detail-cell', colspan: '8' }));
  const toggle = h('button', {
    type: 'button', class: 'details', 'aria-expanded': 'false', 'aria-controls': detailId,
    'aria-label': `Details of refusal ${r.id}: headers and body digest`, text: 'Details',
  });
  toggle.addEventListener('click', () => {
    const open = toggle.getAttribute('aria-expanded') !== 'true';
    // Built when first opened: a page of refusals holds up to 64 headers each.
    if (open && !detail.firstChild.firstChild) detail.firstChild.append(rejectionDetail(r));
    toggle.setAttribute('aria-expanded', String(open));
    detail.hidden = !open;
  });
  const row = h('tr', { 'data-rejection': String(r.id), 'data-reason': r.reason },
    rejectedCell(0, time(r.received_at, { compact: true })),
    rejectedCell(1, clipped(r.source, 'source')),
    rejectedCell(2, h('code', { class: 'reason', text: r.reason })),
    rejectedCell(3, h('span', { class: 'http-status', text: String(r.status) })),
    rejectedCell(4, r.peer ? h('span', { class: 'mono peer', text: r.peer }) : h('span', { class: 'muted', text: '—' })),
    rejectedCell(5, size(r.body_bytes)),
    rejectedCell(6, h('span', { class: 'message', text: r.message })),
    h('td', { class: 'toggle-cell' }, toggle),
  );
  return [row, detail];
}

async function loadRejected(more) {
  const generation = ++rejectedLoading;
  const status = $('rejected-status');
  const f = rejectedFilters();
  if (!more) { rejectedCursor = null; clear($('rejected-body')); }
  status.classList.remove('empty');
  say(status, 'Loading…');
  try {
    const page = await api('/rejections' + query({ ...f, limit: REJECTED_PAGE, cursor: more ? rejectedCursor : null }));
    if (generation !== rejectedLoading) return;
    $('rejected-body').append(...page.rejections.flatMap(rejectionRows));
    rejectedCursor = page.next_cursor;
    $('rejected-more').hidden = !rejectedCursor;
    const shown = $('rejected-body').querySelectorAll('tr[data-rejection]').length;
    $('rejected-table').hidden = shown === 0;
    const filtered = REJECTED_KEYS.some((k) => f[k]);
    if (shown === 0 && !filtered) {
      say(status, NONE_KEPT);
      status.classList.add('empty');
    } else {
      say(status, shown === 0 ? 'No refused delivery matches these filters.'
        : `${shown} refused deliver${shown === 1 ? 'y' : 'ies'} shown` +
          `${rejectedCursor ? '; older ones on the next page' : ''}.`);
    }
  } catch (e) {
    if (generation === rejectedLoading) say(status, `Could not load refused deliveries: ${e.message}`, true);
  }
}

/** Shows the refusals for the filters of the fragment's query (`reason=…&source=…`). */
export function showRejected(search) {
  fillRejectedForm(search);
  return loadRejected(false);
}

export function setup() {
  $('rejected-filters').addEventListener('submit', (e) => { e.preventDefault(); applyRejected(); });
  // The reset event comes before the fields are reset.
  $('rejected-filters').addEventListener('reset', () => setTimeout(applyRejected));
  $('rejected-more').addEventListener('click', () => loadRejected(true));
  $('rejected-refresh').addEventListener('click', () => loadRejected(false));
  $('loyalty-form').addEventListener('submit', lookUpLoyalty);
  $('request-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const id = $('request-id').value.trim();
    if (id) location.hash = `#request/${encodeURIComponent(id)}`;
  });
  $('requests-more').addEventListener('click', () => loadRequests(true));
}
