// The subscriptions view (#subscriptions): each of the user's consumers with its kind, route,
// state, counts and lag, and Pause / Resume behind a confirmation. Names and routes come from
// the server's config; they only ever become text.

import { api } from './api.js';
import { h, $, clear, say, age, confirmDialog } from './dom.js';

function routeText(route) {
  const list = (items, all) => (items ? items.join(', ') : all);
  let text = `${list(route.sources, 'every source')} · ${list(route.types, 'every type')}`;
  if (route.except_types?.length) text += ` except ${route.except_types.join(', ')}`;
  return text;
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
      const updated = await api(`/subscriptions/${encodeURIComponent(sub.name)}/${label.toLowerCase()}`,
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
    h('td', { 'data-label': 'Route', text: routeText(sub.route) }),
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
    clear($('subscriptions-body'), ...subscriptions.map(row));
    say(status, message ?? (subscriptions.length ? '' : 'No subscriptions.'));
  } catch (e) {
    say(status, `Could not load the subscriptions: ${e.message}`, true);
  }
}

export function setup() {
  $('subscriptions-refresh').addEventListener('click', () => show());
}
