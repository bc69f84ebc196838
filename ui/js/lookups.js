// Loyalty balance by customer, and submission requests: the submitted ones listed through their
// events (source `requests`, event id = request id), any one shown by id.

import { api, query } from './api.js';
import { h, $, clear, time, say, statusBadge } from './dom.js';

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
    const a = await api(`/loyalty/${encodeURIComponent(customer)}`);
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
    const r = await api(`/requests/${encodeURIComponent(id)}`);
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

export function setup() {
  $('loyalty-form').addEventListener('submit', lookUpLoyalty);
  $('request-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const id = $('request-id').value.trim();
    if (id) location.hash = `#request/${encodeURIComponent(id)}`;
  });
  $('requests-more').addEventListener('click', () => loadRequests(true));
}
