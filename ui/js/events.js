// The event list: every filter of GET /events, failed events first (the status filter starts
// on `failed`), older pages through the cursor, Retry per failed row and bulk retry of the
// filter. The filters live in the URL (`#events?status=completed&type=order.completed`), so a
// filtered view can be reloaded, bookmarked and pasted.

import { api, eventPath, query } from './api.js';
import {
  h, $, clear, time, say, statusBadge, confirmDialog, copyButton, localInput, utcOf, clipped,
} from './dom.js';
import { retryButtons } from './actions.js';

const PAGE = 50;
let cursor = null;
let loading = 0; // a generation counter: a slow answer for old filters is dropped
let listHash = '#events';

/** The filters as the API takes them; local date-times become RFC 3339 UTC. */
function filters() {
  const form = $('filters');
  return {
    status: form.status.value,
    subscription: form.subscription.value,
    source: form.source.value.trim(),
    type: form.type.value.trim(),
    received_after: utcOf(form.received_after.value),
    received_before: utcOf(form.received_before.value),
  };
}

/**
 * The URL fragment of a set of filters. `status` is always written (`any` for no status
 * filter), so that `#events` alone means the default view: failed events.
 */
function hashOf(f) {
  const q = new URLSearchParams({ status: f.status || 'any' });
  for (const k of ['subscription', 'source', 'type', 'received_after', 'received_before']) {
    if (f[k]) q.set(k, f[k]);
  }
  return `#events?${q}`;
}

/** Fills the form from the fragment's query: absent keys take their defaults. */
function fillForm(search) {
  const q = new URLSearchParams(search ?? '');
  const form = $('filters');
  const status = q.get('status') ?? 'failed';
  const known = [...form.status.options].map((o) => o.value);
  form.status.value = status === 'any' ? '' : (known.includes(status) ? status : 'failed');
  subscriptionOption(q.get('subscription') ?? '');
  form.subscription.value = q.get('subscription') ?? '';
  form.source.value = q.get('source') ?? '';
  form.type.value = q.get('type') ?? '';
  form.received_after.value = localInput(q.get('received_after'));
  form.received_before.value = localInput(q.get('received_before'));
}

/** The subscription filter offers each subscription (and keeps one named by a URL). */
function subscriptionOption(name) {
  const select = $('filters').subscription;
  if (name && ![...select.options].some((o) => o.value === name)) {
    select.append(h('option', { value: name, text: name }));
  }
}

async function loadSubscriptions() {
  try {
    const { subscriptions } = await api('/subscriptions');
    for (const s of subscriptions) if (s.state !== 'removed') subscriptionOption(s.name);
  } catch { /* the filter still takes a name from the URL */ }
}

/** Applying filters changes the URL; the router then shows (and loads) that URL. */
function apply() {
  const hash = hashOf(filters());
  if (location.hash === hash) load(false);
  else location.hash = hash;
}

function describe(f) {
  const parts = [];
  if (f.subscription) parts.push(`subscription ${f.subscription}`);
  if (f.source) parts.push(`source ${f.source}`);
  if (f.type) parts.push(`type ${f.type}`);
  if (f.received_after) parts.push(`received after ${new Date(f.received_after).toLocaleString()}`);
  if (f.received_before) parts.push(`received before ${new Date(f.received_before).toLocaleString()}`);
  return parts.length ? parts.join(', ') : 'no other filter';
}

const LABELS = ['Event ID', 'Source', 'Type', 'Status', 'Attempts', 'Outcome / error', 'Received', 'Actions'];

function cell(i, ...children) {
  return h('td', { 'data-label': LABELS[i] }, ...children);
}

/**
 * What became of the event: its outcome once completed, else its last error, short (two lines
 * at most), named by the subscription it is of when several take the event; the whole text on
 * hover and on the event's page.
 */
function result(event) {
  if (event.status === 'completed' && event.outcome) return h('span', { class: 'outcome mono', text: event.outcome });
  if (event.last_error) {
    const subs = event.subscriptions ?? [];
    const of = subs.length > 1
      ? subs.find((s) => s.last_error === event.last_error && s.status === event.status) : null;
    const text = of ? `${of.name}: ${event.last_error}` : event.last_error;
    return h('span', { class: 'error-text error-short', title: text, text });
  }
  return h('span', { class: 'muted', text: '—' });
}

/**
 * One row; after an action it is rebuilt from the event the server answered. Under a
 * subscription filter the row shows that subscription's state of the event (its status,
 * attempts, outcome or error), and Retry retries that state alone.
 */
export function eventRow(full, subscription) {
  const state = subscription ? full.subscriptions?.find((s) => s.name === subscription) : null;
  const event = state ? {
    ...full, subscriptions: [], status: state.status, attempts: state.attempts,
    outcome: state.outcome, last_error: state.last_error, abandoned: state.abandoned,
  } : full;
  const link = `#event/${encodeURIComponent(event.source)}/${encodeURIComponent(event.event_id)}`;
  const name = `${event.source}/${event.event_id}`;
  const row = h('tr', { 'data-event': name });
  const actions = cell(7);
  actions.append(...retryButtons(event, {
    subscription: state ? subscription : undefined,
    onChange: (updated) => {
      row.replaceWith(eventRow(updated, subscription));
      say($('list-status'), `${updated.source}/${updated.event_id} is now ${updated.status}.`);
    },
    onError: (text) => say($('list-status'), text, true),
    // The event changed since the list was loaded: show it as it is now. A forced retry
    // is offered on its own page only.
    onConflict: async (e) => {
      try { row.replaceWith(eventRow(await api(eventPath(event.source, event.event_id)), subscription)); } catch { /* the message says enough */ }
      say($('list-status'), `Retry of ${name} refused: ${e.message}. A forced retry is on the event's page.`, true);
    },
  }));
  if (event.abandoned) {
    actions.append(h('a', { href: link, 'aria-label': `Review ${name}: its downstream call may have acted`, text: 'Review' }));
  }
  row.append(
    cell(0, h('div', { class: 'id-cell' },
      h('a', { href: link, class: 'mono clip event-id', title: event.event_id, text: event.event_id }),
      copyButton(event.event_id, 'Copy event id', $('list-status')))),
    cell(1, clipped(event.source, 'source')),
    cell(2, clipped(event.type, 'type')),
    cell(3, statusBadge(event)),
    cell(4, String(event.attempts)),
    cell(5, result(event)),
    cell(6, time(event.received_at, { compact: true })),
    actions,
  );
  return row;
}

async function load(more) {
  const generation = ++loading;
  const status = $('list-status');
  if (!more) { cursor = null; clear($('events-body')); }
  say(status, 'Loading…');
  try {
    const page = await api('/events' + query({ ...filters(), limit: PAGE, cursor: more ? cursor : null }));
    if (generation !== loading) return;
    const { subscription } = filters();
    $('events-body').append(...page.events.map((e) => eventRow(e, subscription)));
    cursor = page.next_cursor;
    $('more').hidden = !cursor;
    const shown = $('events-body').children.length;
    say(status, shown === 0 ? 'No events match these filters.'
      : `${shown} event${shown === 1 ? '' : 's'} shown${cursor ? '; older ones on the next page' : ''}.`);
  } catch (e) {
    if (generation === loading) say(status, `Could not load events: ${e.message}`, true);
  }
}

/** Failed, not abandoned events under the filters: what a bulk retry would retry. */
async function countRetryable(f) {
  const MAX_PAGES = 20;
  let count = 0, abandoned = 0, next = null;
  for (let i = 0; i < MAX_PAGES; i++) {
    const page = await api('/events' + query({ ...f, status: 'failed', limit: 500, cursor: next }));
    for (const e of page.events) {
      // With a subscription, its own state decides (the one a bulk retry moves).
      const state = f.subscription ? e.subscriptions.find((s) => s.name === f.subscription) : e;
      if (state?.abandoned) abandoned++; else count++;
    }
    next = page.next_cursor;
    if (!next) return { count, abandoned, more: false };
  }
  return { count, abandoned, more: true };
}

async function bulkRetry() {
  const status = $('list-status');
  const button = $('bulk-retry');
  const f = filters();
  button.disabled = true;
  try {
    say(status, 'Counting the failed events that match…');
    const { count, abandoned, more } = await countRetryable(f);
    if (count === 0) {
      say(status, `No failed events to retry (${describe(f)}).` +
        (abandoned ? ` ${abandoned} abandoned ones need a Force retry each, on their own pages.` : ''));
      return;
    }
    const n = `${more ? 'at least ' : ''}${count}`;
    const ok = await confirmDialog({
      title: `Retry ${n} failed event${count === 1 ? '' : 's'}` +
        (f.subscription ? ` in ${f.subscription}?` : '?'),
      text: `${n} failed event${count === 1 ? '' : 's'} (${describe(f)}) go back to pending, ` +
        'due now, with a fresh attempt budget.' +
        (abandoned ? ` ${abandoned} abandoned event${abandoned === 1 ? ' is' : 's are'} left out: ` +
          'the downstream may have acted, so each needs a Force retry of its own, on its page.' : ''),
      confirmLabel: `Retry ${n}`,
    });
    if (!ok) { say(status, 'Bulk retry cancelled.'); return; }
    const { subscription, source, type, received_after, received_before } = f;
    const body = Object.fromEntries(Object.entries({
      subscription, source, type, received_after, received_before,
    })
      .filter(([, v]) => v));
    const answer = await api('/events/retry', { method: 'POST', body });
    await load(false);
    say(status, `Retried ${answer.retried} event${answer.retried === 1 ? '' : 's'}.`);
  } catch (e) {
    say(status, `Bulk retry failed: ${e.message}`, true);
  } finally {
    button.disabled = false;
    button.focus();
  }
}

export function setup() {
  $('filters').addEventListener('submit', (e) => { e.preventDefault(); apply(); });
  // The reset event comes before the fields are reset.
  $('filters').addEventListener('reset', () => setTimeout(apply));
  $('more').addEventListener('click', () => load(true));
  $('bulk-retry').addEventListener('click', bulkRetry);
}

/** Shows the list for the filters of the fragment's query (`status=failed&type=…`). */
export async function show(search) {
  if ($('filters').subscription.options.length === 1) await loadSubscriptions();
  fillForm(search);
  listHash = hashOf(filters());
  return load(false);
}

/** The fragment of the list as last shown, filters included: where "Back to events" goes. */
export function lastListHash() { return listHash; }
