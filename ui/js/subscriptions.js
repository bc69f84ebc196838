// The subscriptions view (#subscriptions): each of the user's consumers with its origin, kind,
// route, state, counts and lag (each count a link to the event list filtered by the
// subscription and that status), Pause / Resume and Recover (its failures since a time) behind
// a confirmation, Edit (subscription_form.js) and Delete behind a confirmation. A `listen`
// session's own subscription is badged and can be shown alone; it has no Edit (it lives as
// long as its session). Under an ordered one that holds, the keys held by a failed event, each
// linked to that event (Retry or Skip it there). Names, routes, keys and the API's messages
// come from the server; they only ever become text.

import { api, segment } from './api.js';
import { h, $, clear, say, age, confirmDialog, localInput, utcOf } from './dom.js';
import * as editor from './subscription_form.js';

function routeText(route) {
  const list = (items, all) => (items ? items.join(', ') : all);
  let text = `${list(route.sources, 'every source')} · ${list(route.types, 'every type')}`;
  if (route.except_types?.length) text += ` except ${route.except_types.join(', ')}`;
  return text;
}

function ordering(sub) {
  if (!sub.ordered_by) return '';
  return ` · ordered by ${sub.ordered_by}${sub.on_failure === 'skip' ? ' (failures skipped)' : ''}`;
}

// The keys a failed event holds, as one row under its subscription's.
function heldRow(sub, held) {
  const items = held.map((k) => h('li', {},
    h('span', { class: 'mono', text: k.key }), ' held by ',
    h('a', { href: `#event/${encodeURIComponent(k.source)}/${encodeURIComponent(k.event_id)}`,
      class: 'mono', text: `${k.source}/${k.event_id}` }),
    ` (${k.waiting} waiting)`));
  return h('tr', { class: 'held', 'data-held': sub.name },
    h('td', { colspan: '10' },
      h('span', { text: `${sub.name}: ${held.length} key${held.length === 1 ? '' : 's'} held ` +
        '(retry the failed event, or skip it, to let its key go on)' }),
      h('ul', {}, ...items)));
}

function stateBadge(state) {
  // probing: an http subscription whose endpoint failed, sending one event per interval.
  const classes = { active: 'status-completed', paused: 'status-pending', probing: 'status-failed' };
  const cls = classes[state] || '';
  return h('span', { class: `badge ${cls}`.trim(), text: state });
}

function toggle(sub) {
  if (sub.state === 'removed') return [];
  const pausing = sub.state !== 'paused';
  const label = pausing ? 'Pause' : 'Resume';
  const b = h('button', { type: 'button', 'aria-label': `${label} ${sub.name}`, text: label,
    class: pausing ? 'danger' : '' });
  b.addEventListener('click', async () => {
    const text = pausing
      ? `While ${sub.name} is paused it claims nothing: its events wait, and its lag grows. ` +
        'No other subscription is held back. Resume it to deliver what waited.'
      : `${sub.name} claims its events again, the ${sub.lag} waiting first.`;
    if (!(await confirmDialog({ title: `${label} ${sub.name}?`, text, confirmLabel: label }))) {
      b.focus();
      return;
    }
    b.disabled = true;
    try {
      const updated = await api(`/subscriptions/${segment(sub.name)}/${label.toLowerCase()}`,
        { method: 'POST' });
      await show(`${updated.name} is now ${updated.state}.`);
    } catch (e) {
      b.disabled = false;
      say($('subscriptions-status'), `${label} of ${sub.name} failed: ${e.message}`, true);
    }
  });
  return [b];
}

/** After an endpoint's outage: its failures since the time above the table, once. */
function recover(sub) {
  if (sub.state === 'removed' || !sub.counts.failed) return [];
  const b = h('button', { type: 'button', 'aria-label': `Recover ${sub.name}`, text: 'Recover' });
  b.addEventListener('click', async () => {
    const since = utcOf($('recover-since').value);
    if (!since) {
      say($('subscriptions-status'), 'Recover: give a time to recover failures since.', true);
      $('recover-since').focus();
      return;
    }
    const text = `Every failed state of ${sub.name} whose last attempt ended since ` +
      `${new Date(since).toLocaleString()} goes back to pending, due now, with a fresh attempt ` +
      `budget (${sub.counts.failed} failed in all, at any time). Abandoned at-most-once ` +
      'states are left for a Force retry each, on their pages.';
    if (!(await confirmDialog({ title: `Recover ${sub.name}?`, text, confirmLabel: 'Recover' }))) {
      b.focus();
      return;
    }
    b.disabled = true;
    try {
      const { retried } = await api(`/subscriptions/${segment(sub.name)}/recover?` +
        new URLSearchParams({ since }), { method: 'POST' });
      await show(`${sub.name}: retried ${retried} failed state${retried === 1 ? '' : 's'}.`);
    } catch (e) {
      b.disabled = false;
      say($('subscriptions-status'), `Recover of ${sub.name} failed: ${e.message}`, true);
    }
  });
  return [b];
}

/** Edit opens the editor on it; a session's has none: it ends with its `listen`. */
function editButton(sub) {
  if (sub.state === 'removed' || sub.origin === 'session') return [];
  const b = h('button', { type: 'button', 'aria-label': `Edit ${sub.name}`, text: 'Edit',
    class: 'secondary' });
  b.addEventListener('click', () => editor.edit(sub));
  return [b];
}

function deleteText(sub) {
  const { pending, claimed } = sub.counts;
  const unfinished = pending + claimed;
  const one = unfinished === 1;
  let text = `${sub.name} stops on every node within a second. ` + (unfinished
    ? `Its ${unfinished} unfinished event${one ? '' : 's'} (${pending} pending, ${claimed} ` +
      `claimed) end${one ? 's' : ''} completed with outcome "removed": ${sub.name} never gets ` +
      `${one ? 'it' : 'them'}. `
    : 'It has no unfinished events. ') +
    'Its history stays readable; no other subscription is touched.';
  if (sub.origin === 'config') {
    text += '\nA node whose config names it adds it back when that node next starts.';
  } else if (sub.origin === 'session') {
    text += '\nThe listen session using it stops receiving events.';
  }
  return text;
}

function deleteButton(sub) {
  if (sub.state === 'removed') return [];
  const b = h('button', { type: 'button', 'aria-label': `Delete ${sub.name}`, text: 'Delete',
    class: 'danger' });
  b.addEventListener('click', async () => {
    if (!(await confirmDialog({ title: `Delete ${sub.name}?`, text: deleteText(sub),
      confirmLabel: 'Delete' }))) {
      b.focus();
      return;
    }
    b.disabled = true;
    try {
      const { finished } = await api(`/subscriptions/${segment(sub.name)}`, { method: 'DELETE' });
      editor.close();
      await show(`Deleted ${sub.name}: ${finished} unfinished event${finished === 1 ? '' : 's'} ` +
        'completed with outcome "removed".');
    } catch (e) {
      b.disabled = false;
      say($('subscriptions-status'), `Delete of ${sub.name} failed: ${e.message}`, true);
    }
  });
  return [b];
}

function originBadge(origin) {
  const label = origin === 'session' ? 'listen session' : origin;
  return h('span', { class: `badge origin origin-${origin}`, text: label });
}

/** A count that opens the event list filtered by the subscription and that status. */
function count(sub, status) {
  const n = String(sub.counts[status]);
  if (sub.state === 'removed') return n;
  const q = new URLSearchParams({ status, subscription: sub.name });
  return h('a', { href: `#events?${q}`, 'aria-label': `${n} ${status} in ${sub.name}`, text: n });
}

function row(sub) {
  return h('tr', { 'data-name': sub.name },
    h('td', { 'data-label': 'Name' }, h('span', { class: 'mono', text: sub.name }), ' ',
      originBadge(sub.origin)),
    h('td', { 'data-label': 'Kind' }, sub.kind,
      sub.url_origin && h('span', { class: 'mono muted endpoint', text: sub.url_origin })),
    h('td', { 'data-label': 'Route', text: routeText(sub.route) + ordering(sub) }),
    h('td', { 'data-label': 'State' }, stateBadge(sub.state)),
    h('td', { 'data-label': 'Pending' }, count(sub, 'pending')),
    h('td', { 'data-label': 'Claimed' }, count(sub, 'claimed')),
    h('td', { 'data-label': 'Completed' }, count(sub, 'completed')),
    h('td', { 'data-label': 'Failed' }, count(sub, 'failed')),
    h('td', { 'data-label': 'Lag', class: 'lag',
      text: sub.oldest_pending_seconds == null ? String(sub.lag)
        : `${sub.lag} (oldest ${age(sub.oldest_pending_seconds)})` }),
    h('td', { 'data-label': 'Actions' }, ...toggle(sub), ...recover(sub), ...editButton(sub),
      ...deleteButton(sub)),
  );
}

export async function show(message) {
  const status = $('subscriptions-status');
  try {
    const { subscriptions: all } = await api('/subscriptions');
    const origin = $('subscriptions-origin').value;
    const subscriptions = all.filter((s) => !origin || s.origin === origin);
    const rows = [];
    for (const sub of subscriptions) {
      rows.push(row(sub));
      if (sub.on_failure === 'hold' && sub.state !== 'removed') {
        const { held_keys: held } = await api(`/subscriptions/${segment(sub.name)}`);
        if (held?.length) rows.push(heldRow(sub, held));
      }
    }
    clear($('subscriptions-body'), ...rows);
    const sessions = all.filter((s) => s.origin === 'session' && s.state !== 'removed').length;
    const shown = subscriptions.length ? '' : `No subscriptions${origin ? ' of that origin' : ''}.`;
    say(status, message ?? (sessions && origin !== 'session'
      ? `${shown} ${sessions} listen session${sessions === 1 ? '' : 's'} open.`.trim() : shown));
  } catch (e) {
    say(status, `Could not load the subscriptions: ${e.message}`, true);
  }
}

export function setup() {
  // Recover looks back a day unless told otherwise.
  $('recover-since').value = localInput(new Date(Date.now() - 24 * 3600 * 1000).toISOString());
  $('subscriptions-refresh').addEventListener('click', () => show());
  $('subscriptions-origin').addEventListener('change', () => show());
  editor.setup(show);
}
