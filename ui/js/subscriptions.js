// The subscriptions view (#subscriptions): each of the user's consumers with its kind, route,
// state, counts and lag, and Pause / Resume behind a confirmation. Under an ordered one that
// holds, the keys held by a failed event, each linked to that event (Retry or Skip it there).
// Names, routes and keys come from the server; they only ever become text.

import { api, segment } from './api.js';
import { h, $, clear, say, age, confirmDialog } from './dom.js';

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

function row(sub) {
  const c = sub.counts;
  return h('tr', { 'data-name': sub.name },
    h('td', { 'data-label': 'Name' }, h('span', { class: 'mono', text: sub.name })),
    h('td', { 'data-label': 'Kind', text: sub.kind }),
    h('td', { 'data-label': 'Route', text: routeText(sub.route) + ordering(sub) }),
    h('td', { 'data-label': 'State' }, stateBadge(sub.state)),
    h('td', { 'data-label': 'Pending', text: String(c.pending) }),
    h('td', { 'data-label': 'Claimed', text: String(c.claimed) }),
    h('td', { 'data-label': 'Completed', text: String(c.completed) }),
    h('td', { 'data-label': 'Failed', text: String(c.failed) }),
    h('td', { 'data-label': 'Lag', class: 'lag',
      text: sub.oldest_pending_seconds == null ? String(sub.lag)
        : `${sub.lag} (oldest ${age(sub.oldest_pending_seconds)})` }),
    h('td', { 'data-label': 'Actions' }, ...toggle(sub)),
  );
}

export async function show(message) {
  const status = $('subscriptions-status');
  try {
    const { subscriptions } = await api('/subscriptions');
    const rows = [];
    for (const sub of subscriptions) {
      rows.push(row(sub));
      if (sub.on_failure === 'hold' && sub.state !== 'removed') {
        const { held_keys: held } = await api(`/subscriptions/${segment(sub.name)}`);
        if (held?.length) rows.push(heldRow(sub, held));
      }
    }
    clear($('subscriptions-body'), ...rows);
    say(status, message ?? (subscriptions.length ? '' : 'No subscriptions.'));
  } catch (e) {
    say(status, `Could not load the subscriptions: ${e.message}`, true);
  }
}

export function setup() {
  $('subscriptions-refresh').addEventListener('click', () => show());
}
