// One event: its fields, the body as text (pretty-printed when it is JSON), and the attempt
// history as a timeline. The body is a delivery's content, attacker-controlled: it only ever
// becomes the text of a <pre>.

import { api, eventPath } from './api.js';
import { h, $, clear, time, say, statusBadge, copyButton } from './dom.js';
import { retryButtons } from './actions.js';

function field(label, ...value) {
  return [h('dt', { text: label }), h('dd', {}, ...value)];
}

function bodyText(payload) {
  if (typeof payload === 'string') return payload;
  return JSON.stringify(payload, null, 2);
}

/** How long an attempt took: "240 ms", "3.2 s"; "running" while it runs. */
function duration(a) {
  if (!a.finished_at) return 'running';
  const ms = new Date(a.finished_at) - new Date(a.started_at);
  if (Number.isNaN(ms)) return '—';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/**
 * An http endpoint's answer, as the forwarder writes it into the attempt's error ("the
 * endpoint answered 503 Service Unavailable: <the start of its body>"): its status code and a
 * bounded excerpt of its body. The history keeps no other record of the answer.
 */
const ANSWER = /^the endpoint answered (\d{3})\b[^:]*: ?([\s\S]*)$/;
const EXCERPT = 200;

function answerFields(a) {
  const m = a.error ? ANSWER.exec(a.error) : null;
  if (!m) return [];
  // The consumer appends why it stopped retrying; that is not the endpoint's.
  const body = m[2].replace(/ \(gave up after \d+ attempts?\)$/, '').trim();
  const excerpt = body.length > EXCERPT ? `${body.slice(0, EXCERPT)}…` : body;
  return [
    field('Answer', h('span', { class: 'mono answer-status', text: m[1] })),
    body ? field('Body (start)', h('span', { class: 'mono answer-body', title: body, text: excerpt })) : [],
  ];
}

function timeline(history) {
  if (!history.length) return h('p', { class: 'muted', text: 'No attempt yet.' });
  return h('ol', { class: 'timeline', 'aria-label': 'Attempt history, first attempt first' },
    history.map((a) => h('li', { class: `result-${a.result ?? 'running'}` },
      h('p', { class: 'attempt-head' },
        h('strong', { text: `${a.subscription} · attempt ${a.attempt}` }), ' · ',
        h('span', { class: 'badge', text: a.result ?? 'in progress' })),
      h('dl', { class: 'fields compact' },
        field('Node (worker)', h('span', { class: 'mono attempt-node', text: a.worker })),
        field('Started', time(a.started_at)),
        field('Finished', time(a.finished_at)),
        field('Duration', h('span', { class: 'attempt-duration', text: duration(a) })),
        ...answerFields(a),
        a.error ? field('Error', h('span', { class: 'error-text', text: a.error })) : []),
    )));
}

/** Each subscription's state of the event, with a Retry of that state alone. */
function subscriptionTable(event, onChange, onError) {
  if (!event.subscriptions?.length) {
    return h('p', { class: 'muted', text: 'No subscription takes this event: it is stored only.' });
  }
  return h('table', { id: 'event-subscriptions', class: 'cards-on-phone' },
    h('caption', { class: 'sr-only', text: 'Each subscription’s state of this event' }),
    h('thead', {}, h('tr', {},
      ...['Subscription', 'Status', 'Attempts', 'Outcome / error', 'Actions']
        .map((t) => h('th', { scope: 'col', text: t })))),
    h('tbody', {}, ...event.subscriptions.map((s) => h('tr', { 'data-subscription': s.name },
      h('td', { 'data-label': 'Subscription' }, h('span', { class: 'mono', text: s.name })),
      h('td', { 'data-label': 'Status' }, statusBadge(s)),
      h('td', { 'data-label': 'Attempts', text: String(s.attempts) }),
      h('td', { 'data-label': 'Outcome / error' }, s.status === 'failed' && s.last_error
        ? h('span', { class: 'error-text', text: s.last_error }) : (s.outcome ?? '—')),
      h('td', { 'data-label': 'Actions' }, ...retryButtons(
        { ...s, source: event.source, event_id: event.event_id },
        { force: true, subscription: s.name, onChange, onError })),
    ))));
}

/** The subscriptions whose route took the event and whose filter left it out. */
function filteredOut(event) {
  if (!event.filtered_out?.length) return [];
  return h('p', { id: 'event-filtered-out' }, 'Left out by the filter of: ',
    ...event.filtered_out.flatMap((name, i) => [i ? ', ' : '', h('span', { class: 'mono', text: name })]),
    ' (no state there: never delivered to it).');
}

function render(event, message) {
  const box = $('event-detail');
  const status = h('p', { role: 'status', id: 'detail-status' });
  if (message) say(status, message);
  // The one place that offers a forced retry, behind its confirmation.
  const actions = retryButtons(event, {
    force: true,
    onChange: (updated) => load(updated.source, updated.event_id,
      `${updated.source}/${updated.event_id} is now ${updated.status}.`),
    onError: (text) => say(status, text, true),
  });
  clear(box,
    h('dl', { class: 'fields' },
      field('Event ID', h('span', { class: 'mono', text: event.event_id }), ' ',
        copyButton(event.event_id, 'Copy event id', status)),
      field('Source', event.source),
      field('Type', event.type),
      field('Status', statusBadge(event)),
      field('Abandoned', event.abandoned
        ? 'yes: an at-most-once call was cut off, the downstream may have acted' : 'no'),
      field('Outcome', event.outcome ?? '—'),
      field('Last error', event.last_error ? h('span', { class: 'error-text', text: event.last_error }) : '—'),
      field('Attempts', String(event.attempts)),
      field('Deliveries', String(event.deliveries)),
      field('Payload mismatches', String(event.payload_mismatches),
        event.payload_mismatches ? ' (redeliveries whose body differed; the first body is kept)' : ''),
      field('Received', time(event.received_at)),
      field('Last delivered', time(event.last_delivered_at)),
      field('Next attempt', time(event.next_attempt_at)),
      field('Finished', time(event.completed_at)),
    ),
    actions.length ? h('div', { class: 'row' }, ...actions) : [],
    status,
    h('h2', { text: 'Subscriptions' }),
    subscriptionTable(event,
      (updated) => load(updated.source, updated.event_id,
        `${updated.source}/${updated.event_id} is now ${updated.status}.`),
      (text) => say(status, text, true)),
    filteredOut(event),
    h('h2', { text: 'Body' }),
    h('pre', { class: 'body', id: 'event-body', tabindex: '0', 'aria-label': 'Delivery body' },
      bodyText(event.payload)),
    h('h2', { text: 'Attempts' }),
    timeline(event.history ?? []),
  );
}

export async function load(source, eventId, message) {
  $('event-title').textContent = `Event ${source}/${eventId}`;
  const box = $('event-detail');
  try {
    render(await api(eventPath(source, eventId)), message);
  } catch (e) {
    clear(box, h('p', { class: 'error', role: 'alert', text: `Could not load the event: ${e.message}` }));
  }
}
