// The event list: every filter of GET /events, failed events first (the status filter starts
// on `failed`), older pages through the cursor, Retry per row and bulk retry of the filter.

import { api, query } from './api.js';
import { h, $, clear, time, say, statusBadge, confirmDialog } from './dom.js';
import { retryButtons } from './actions.js';

const PAGE = 50;
let cursor = null;
let loading = 0; // a generation counter: a slow answer for old filters is dropped

/** The filters as the API takes them; local date-times become RFC 3339 UTC. */
function filters() {
  const form = $('filters');
  const utc = (value) => (value ? new Date(value).toISOString() : undefined);
  return {
    status: form.status.value,
    source: form.source.value.trim(),
    type: form.type.value.trim(),
    received_after: utc(form.received_after.value),
    received_before: utc(form.received_before.value),
  };
}

function describe(f) {
  const parts = [];
  if (f.source) parts.push(`source ${f.source}`);
  if (f.type) parts.push(`type ${f.type}`);
  if (f.received_after) parts.push(`received after ${new Date(f.received_after).toLocaleString()}`);
  if (f.received_before) parts.push(`received before ${new Date(f.received_before).toLocaleString()}`);
  return parts.length ? parts.join(', ') : 'no other filter';
}

const LABELS = ['Event ID', 'Source', 'Type', 'Status', 'Attempts', 'Last error', 'Received', 'Actions'];

function cell(i, ...children) {
  return h('td', { 'data-label': LABELS[i] }, ...children);
}

/** One row; after an action it is rebuilt from the event the server answered. */
export function eventRow(event) {
  const link = `#event/${encodeURIComponent(event.source)}/${encodeURIComponent(event.event_id)}`;
  const row = h('tr', { 'data-event': `${event.source}/${event.event_id}` });
  const actions = cell(7);
  actions.append(...retryButtons(event, {
    onChange: (updated) => {
      row.replaceWith(eventRow(updated));
      say($('list-status'), `${updated.source}/${updated.event_id} is now ${updated.status}.`);
    },
    onError: (text) => say($('list-status'), text, true),
  }));
  row.append(
    cell(0, h('a', { href: link, class: 'mono', text: event.event_id })),
    cell(1, event.source),
    cell(2, event.type),
    cell(3, statusBadge(event)),
    cell(4, String(event.attempts)),
    cell(5, event.last_error ? h('span', { class: 'error-text', text: event.last_error }) : h('span', { class: 'muted', text: '—' })),
    cell(6, time(event.received_at)),
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
    $('events-body').append(...page.events.map(eventRow));
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
    for (const e of page.events) { if (e.abandoned) abandoned++; else count++; }
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
        (abandoned ? ` ${abandoned} abandoned ones need a Force retry each.` : ''));
      return;
    }
    const n = `${more ? 'at least ' : ''}${count}`;
    const ok = await confirmDialog({
      title: `Retry ${n} failed event${count === 1 ? '' : 's'}?`,
      text: `${n} failed event${count === 1 ? '' : 's'} (${describe(f)}) go back to pending, ` +
        'due now, with a fresh attempt budget.' +
        (abandoned ? ` ${abandoned} abandoned event${abandoned === 1 ? ' is' : 's are'} left out: ` +
          'the downstream may have acted, so each needs a Force retry of its own.' : ''),
      confirmLabel: `Retry ${n}`,
    });
    if (!ok) { say(status, 'Bulk retry cancelled.'); return; }
    const { source, type, received_after, received_before } = f;
    const body = Object.fromEntries(Object.entries({ source, type, received_after, received_before })
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
  $('filters').addEventListener('submit', (e) => { e.preventDefault(); load(false); });
  $('filters').addEventListener('reset', () => setTimeout(() => load(false)));
  $('more').addEventListener('click', () => load(true));
  $('bulk-retry').addEventListener('click', bulkRetry);
}

export function show() { return load(false); }
