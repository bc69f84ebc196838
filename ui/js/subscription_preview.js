// The editor's preview (issue 61): the filter and transform as typed, run by
// `POST /subscriptions/preview` on one stored event before anything is saved, for a new
// subscription as for a change. The event is typed (source and event id) or picked from the
// recent events the form's route takes. Event ids, types, the delivered body and a program's
// error are the senders' and the server's: they only ever become text.

import { api } from './api.js';
import { h, $, clear } from './dom.js';

/** How many of the newest events are read to pick from, and how many of those are offered. */
const READ = 100;
const OFFERED = 10;

/** The form's side: its route and rules as typed, and how it shows a refusal of a rule. */
let form = null;
/** The events offered in the pick list, in its order. */
let offered = [];

/** A route's type glob (`*`, `?`) as the fan-out reads it. */
function glob(pattern) {
  const escaped = pattern.replace(/[.+^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`^${escaped.replace(/\*/g, '.*').replace(/\?/g, '.')}$`);
}

/** Whether a route takes an event: no sources is every one but `requests` (downstream's). */
function takes(route, event) {
  const source = route.sources
    ? route.sources.includes(event.source)
    : (event.source === 'requests') === (route.kind === 'downstream');
  return source && (!route.types || route.types.some((t) => glob(t).test(event.type ?? '')));
}

function result(...children) {
  clear($('sp-result'), ...children);
}

function failed(message) {
  result(h('p', { id: 'sp-verdict', class: 'error', role: 'alert', text: message }));
}

/** The newest events (one page), those the route takes offered to pick from. */
async function listRecent() {
  const route = form.route();
  const q = new URLSearchParams({ limit: String(READ) });
  if (route.sources?.length === 1) q.set('source', route.sources[0]);
  const pick = $('sp-pick');
  $('sp-recent').disabled = true;
  try {
    const { events } = await api(`/events?${q}`);
    offered = events.filter((e) => takes(route, e)).slice(0, OFFERED);
    const head = offered.length
      ? `${offered.length} recent event${offered.length === 1 ? '' : 's'} of the route: choose one`
      : `none of the newest ${READ} events is taken by the route: type one above`;
    clear(pick, h('option', { value: '', text: head }),
      ...offered.map((e, i) => h('option', { value: String(i),
        text: `${e.source}/${e.event_id} · ${e.type ?? 'no type'} · ` +
          `${new Date(e.received_at).toLocaleString()}` })));
    pick.focus();
  } catch (e) {
    failed(`Could not list the recent events: ${e.message}`);
  } finally {
    $('sp-recent').disabled = false;
  }
}

function picked() {
  const event = offered[Number($('sp-pick').value)];
  if (!$('sp-pick').value || !event) return;
  $('sp-source').value = event.source;
  $('sp-event_id').value = event.event_id;
}

/** A delivered body as text: a JSON value pretty-printed, a text body as it is. */
function bodyText(value) {
  return typeof value === 'string' ? value : JSON.stringify(value, null, 2);
}

function verdict(matches, text) {
  return h('p', { id: 'sp-verdict', 'data-matches': String(matches) },
    h('span', { class: `badge ${matches ? 'status-completed' : 'status-pending'}`,
      text: matches ? 'matches' : 'does not match' }), ' ', text);
}

function delivered(text) {
  return h('pre', { id: 'sp-delivered', class: 'body', tabindex: '0',
    'aria-label': 'What would be delivered' }, text);
}

function render(answer, name, transformed) {
  if (!answer.matches) {
    result(verdict(false, `${name}: the filter leaves it out. It would get no state in this ` +
      'subscription and never be delivered to it.'));
  } else if (answer.error != null) {
    result(verdict(true, `${name}, but the transform fails on it: the attempt would fail ` +
      'permanently with this error.'),
    h('p', { id: 'sp-error', class: 'error-text', text: String(answer.error) }));
  } else if (answer.delivered_base64 != null) {
    result(verdict(true, `${name}: its body, bytes that are not text, would be delivered as ` +
      'stored (base64 below).'), delivered(answer.delivered_base64));
  } else if (transformed && answer.delivered === null) {
    result(verdict(true, `${name}, but the transform gives no output: it would be completed ` +
      'with outcome filtered, delivered nowhere.'));
  } else {
    result(verdict(true, `${name}: this would be delivered${transformed ? ' (the transform\'s ' +
      'output)' : ', the body as stored'}.`), delivered(bodyText(answer.delivered)));
  }
}

async function run() {
  form.clearError();
  result();
  const source = $('sp-source').value.trim();
  const eventId = $('sp-event_id').value.trim();
  if (!source || !eventId) {
    failed('Preview: give a source and an event ID, or pick a recent event.');
    $(source ? 'sp-event_id' : 'sp-source').focus();
    return;
  }
  let rules;
  try {
    rules = form.rules();
  } catch (e) {
    form.showError(e);
    return;
  }
  const body = { filter: rules.filter, event: { source, event_id: eventId } };
  if (rules.transform !== null) body.transform = rules.transform;
  result(h('p', { class: 'muted', text: 'Previewing…' }));
  $('sp-run').disabled = true;
  try {
    const answer = await api('/subscriptions/preview', { method: 'POST', body });
    render(answer, `${source}/${eventId}`, rules.transform !== null);
    // The answer is below the fold of a long form: bring it into view.
    $('sp-result').scrollIntoView({ block: 'nearest' });
  } catch (e) {
    // A refused filter or transform is shown beside its field; a missing or purged event here.
    if (form.ruleError(e)) result();
    else failed(`Preview of ${source}/${eventId}: ${e.message}`);
  } finally {
    $('sp-run').disabled = false;
  }
}

/** The panel as new, for an editor just opened (the form's reset empties its inputs). */
export function reset() {
  offered = [];
  clear($('sp-pick'), h('option', { value: '', text: 'press List recent events' }));
  result();
}

/**
 * `side` is the form's: `route()` ({kind, sources, types}), `rules()` ({filter, transform}
 * as they would be sent; throws a refusal naming the field), `showError(e)`, `ruleError(e)`
 * (answers whether `e` named a rule and was shown beside it) and `clearError()`.
 */
export function setup(side) {
  form = side;
  $('sp-recent').addEventListener('click', listRecent);
  $('sp-pick').addEventListener('change', picked);
  $('sp-run').addEventListener('click', run);
}
