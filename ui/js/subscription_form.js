// The subscription editor of the subscriptions view: a new subscription (POST), a change to one
// (PATCH with only the fields changed, so that a field nobody touched is never rewritten from a
// stale page), and a rotation of its secret. The API checks every field with the config's own
// check; a refusal is shown beside the form (beside the filter or transform when it names one),
// which keeps what was typed. A generated secret is shown once, on this page only, and kept
// nowhere. The filter and transform can be previewed on a stored event first
// (subscription_preview.js).

import { api, segment, ApiError } from './api.js';
import { $, say, confirmDialog, copyButton } from './dom.js';
import * as preview from './subscription_preview.js';

/** The kinds that call out, each with its settings (SPEC section 13's names). */
const CALL_OUT = {
  http: ['url', 'timeout_ms', 'concurrency', 'rate_per_second', 'ca_file'],
  nats: ['url', 'subject', 'stream', 'ca_file', 'timeout_ms', 'concurrency', 'rate_per_second'],
  amqp: ['url', 'exchange', 'routing_key', 'ca_file', 'timeout_ms', 'concurrency',
    'rate_per_second'],
};
const CALL_OUT_FIELDS = [...new Set(Object.values(CALL_OUT).flat())];
/** The kinds whose delivered body a transform makes; the built-in ones deliver none. */
const TRANSFORMED = ['http', 'pull', 'nats', 'amqp'];
const URL_PLACEHOLDER = {
  http: 'https://billing.internal/hooks',
  nats: 'nats://user:password@nats.internal:4222',
  amqp: 'amqps://user:password@rabbit.internal/vhost',
};
const LISTS = ['sources', 'types'];
const NUMBERS = ['max_attempts', 'backoff_base_ms', 'backoff_max_ms', 'timeout_ms', 'concurrency',
  'rate_per_second'];
const TEXTS = ['mode', 'ordered_by', 'url', 'ca_file', 'subject', 'stream', 'exchange',
  'routing_key'];
const RULES = ['filter', 'transform'];
const FIELDS = [...LISTS, ...NUMBERS, ...TEXTS, 'on_failure', ...RULES];

/** The subscription being edited (as `GET /subscriptions` shows it), or null for a new one. */
let editing = null;
/** What the view does after a change: reload its table, saying `message`. */
let changed = async () => {};

const input = (name) => $(`sf-${name}`);

function listOf(text) {
  const items = text.split(',').map((s) => s.trim()).filter(Boolean);
  return items.length ? items : null;
}

/** Empty: the default. Anything but digits goes as typed, for the API to refuse by name. */
function numberOf(text) {
  const t = text.trim();
  if (!t) return null;
  return /^\d+$/.test(t) ? Number(t) : t;
}

/** Empty: no filter. Text that is not JSON is refused here, naming the field as the API would. */
function filterOf(text) {
  if (!text.trim()) return null;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError(0, 'invalid_filter', `filter: is not JSON (${e.message})`);
  }
}

/** A jq program goes as typed (its spaces are its own); only blank text means none. */
function transformOf(text) {
  return text.trim() ? text : null;
}

/** Every field of the form as the API's JSON (null: not given, the default). */
function formValues() {
  const v = {};
  for (const f of LISTS) v[f] = listOf(input(f).value);
  for (const f of NUMBERS) v[f] = numberOf(input(f).value);
  for (const f of TEXTS) v[f] = input(f).value.trim() || null;
  // on_failure means something only with ordered_by; alone the API refuses it.
  v.on_failure = v.ordered_by ? input('on_failure').value : null;
  v.filter = filterOf(input('filter').value);
  v.transform = transformOf(input('transform').value);
  return v;
}

/** Whether a kind takes a field: a call-out setting its own kinds, a transform theirs. */
function applies(kind, field) {
  if (CALL_OUT_FIELDS.includes(field)) return CALL_OUT[kind]?.includes(field) ?? false;
  return field !== 'transform' || TRANSFORMED.includes(kind);
}

/** A subscription's current fields as `formValues` reads them, from its view. */
function currentValues(sub) {
  const v = { sources: sub.route.sources, types: sub.route.types, mode: sub.mode, url: null,
    on_failure: sub.ordered_by ? sub.on_failure : null };
  for (const f of [...NUMBERS, ...TEXTS, ...RULES]) {
    if (f !== 'mode' && f !== 'url') v[f] = sub[f] ?? null;
  }
  return v;
}

function fill(values) {
  for (const f of LISTS) input(f).value = values[f] ? values[f].join(', ') : '';
  for (const f of [...NUMBERS, ...TEXTS]) {
    input(f).value = values[f] == null ? '' : String(values[f]);
  }
  input('on_failure').value = values.on_failure ?? 'hold';
  // Pretty-printed, so that an untouched filter reads back as the same JSON.
  input('filter').value = values.filter == null ? '' : JSON.stringify(values.filter, null, 2);
  input('transform').value = values.transform ?? '';
}

function showKindFields() {
  const kind = input('kind').value;
  const settings = CALL_OUT[kind];
  $('sf-http').hidden = !settings;
  $('sf-transform-box').hidden = !TRANSFORMED.includes(kind);
  if (!settings) return;
  const broker = kind !== 'http';
  $('sf-http-legend').textContent = broker ? `Broker (${kind})` : 'Endpoint (http)';
  for (const box of $('sf-http').querySelectorAll('[data-kinds]')) {
    box.hidden = !box.dataset.kinds.split(' ').includes(kind);
  }
  input('url').placeholder = URL_PLACEHOLDER[kind];
  $('sf-concurrency-label').textContent = broker ? 'Publishes in flight' : 'Calls in flight';
  $('sf-rate-label').textContent = broker ? 'Publishes per second' : 'Calls per second';
}

function clearError() {
  for (const el of $('sub-form').querySelectorAll('p.error[id^="sf-"]')) say(el, '');
  for (const el of $('sub-editor').querySelectorAll('[aria-invalid]')) {
    el.removeAttribute('aria-invalid');
  }
}

/** `message` beside the field `name` (a text area has a place of its own), marked and focused. */
function mark(name, message) {
  say($(`sf-${name}-error`) ?? $('sf-error'), message, true);
  input(name).setAttribute('aria-invalid', 'true');
  input(name).focus();
}

/** The API's refusal beside the form; the field it names (`url: …`) marked and focused. */
function showError(e) {
  const named = e.status === 409 ? 'name' : /^([a-z_]+)/.exec(e.message)?.[1];
  if (named && ['name', 'kind', ...FIELDS].includes(named)) mark(named, e.message);
  else say($('sf-error'), e.message, true);
}

/** A refusal that names the filter or the transform (the preview's 422) beside that field. */
function ruleError(e) {
  const named = /^([a-z_]+):/.exec(e.message)?.[1];
  if (!RULES.includes(named)) return false;
  mark(named, e.message);
  return true;
}

/** What the preview runs: the rules as a save would send them. */
function rules() {
  const kind = input('kind').value;
  return { filter: filterOf(input('filter').value),
    transform: applies(kind, 'transform') ? transformOf(input('transform').value) : null };
}

function route() {
  return { kind: input('kind').value, sources: listOf(input('sources').value),
    types: listOf(input('types').value) };
}

function open(title, hint) {
  clearError();
  $('sub-form-title').textContent = title;
  $('sub-form-hint').textContent = hint;
  $('sub-editor').hidden = false;
  $('subscriptions-new').setAttribute('aria-expanded', 'true');
  showKindFields();
  preview.reset();
  $('sub-form-title').focus();
}

export function close() {
  editing = null;
  $('sub-editor').hidden = true;
  $('subscriptions-new').setAttribute('aria-expanded', 'false');
}

function openNew() {
  editing = null;
  $('sub-form').reset();
  input('name').disabled = false;
  input('kind').disabled = false;
  $('sf-url-hint').textContent = 'Its query or user info may hold a credential: it is never ' +
    'shown back, only its scheme, host and port.';
  $('sf-submit').textContent = 'Create';
  $('sub-rotate').hidden = true;
  open('New subscription', 'It takes the events stored from now on. An http or pull ' +
    'subscription is given a generated secret, shown once after it is made.');
  input('name').focus();
}

/** The editor on `sub`: every field but its name, kind and secret. */
export function edit(sub) {
  editing = sub;
  $('sub-form').reset();
  input('name').value = sub.name;
  input('kind').value = sub.kind;
  input('name').disabled = true;
  input('kind').disabled = true;
  fill(currentValues(sub));
  const calls = sub.kind === 'http' ? 'calls' : 'publishes to';
  $('sf-url-hint').textContent = sub.url_origin
    ? `Now ${calls} ${sub.url_origin} (the whole URL is never shown: it may hold a credential). ` +
      'Leave empty to keep it; a URL typed here replaces it.'
    : 'Leave empty to keep it.';
  $('sf-submit').textContent = 'Save changes';
  const secreted = ['http', 'pull'].includes(sub.kind);
  $('sub-rotate').hidden = !secreted;
  const hint = sub.origin === 'config'
    ? `${sub.name} comes from a node's config. Once changed here it is made through the API: ` +
      'the config no longer changes it.'
    : 'Only the fields you change are sent.' +
      (secreted ? ' The secret changes by rotation, below.' : '');
  open(`Edit ${sub.name}`, hint);
}

/** A secret shown once, with the warning that it will not be shown again by this page. */
function showSecret(title, secret, warning) {
  $('sub-secret-title').textContent = title;
  $('sub-secret-warning').textContent = warning;
  $('sub-secret-value').textContent = secret;
  $('sub-secret-copy').replaceChildren(copyButton(secret, 'Copy the secret', $('sub-secret-status')));
  $('sub-secret').hidden = false;
  $('sub-secret-done').focus();
}

/** Takes a shown secret off the page: on leaving the view, and on signing out. */
export function hideSecret() {
  $('sub-secret-value').textContent = '';
  $('sub-secret-copy').replaceChildren();
  say($('sub-secret-status'), '');
  $('sub-secret').hidden = true;
}

const SHOWN_ONCE = 'It is shown this once: copy it now. This page keeps it nowhere, and ' +
  'hides it when you leave or press the button below.';

function secretNote(sub) {
  return sub.kind === 'pull'
    ? `${SHOWN_ONCE} Only its digest is stored: it cannot be read again, only rotated.`
    : `${SHOWN_ONCE} (An admin can read it again through GET /subscriptions/${sub.name}/secret.)`;
}

async function create() {
  const kind = input('kind').value;
  const body = { name: input('name').value.trim(), kind };
  for (const [f, v] of Object.entries(formValues())) {
    if (v !== null && applies(kind, f)) body[f] = v;
  }
  const made = await api('/subscriptions', { method: 'POST', body });
  close();
  const secret = made.signing_secret ?? made.token;
  if (secret) {
    const what = made.token ? 'token' : 'signing secret';
    showSecret(`The ${what} of ${made.name}`, secret, secretNote(made));
  }
  await changed(`Created ${made.name}.`);
}

async function save() {
  const sub = editing;
  const now = formValues();
  const before = currentValues(sub);
  const patch = {};
  for (const f of FIELDS) {
    if (applies(sub.kind, f) && JSON.stringify(now[f]) !== JSON.stringify(before[f])) {
      patch[f] = now[f];
    }
  }
  const names = Object.keys(patch);
  if (!names.length) {
    say($('sf-error'), 'Nothing changed.', false);
    return;
  }
  await api(`/subscriptions/${segment(sub.name)}`, { method: 'PATCH', body: patch });
  close();
  await changed(`Saved ${sub.name}: ${names.join(', ')} changed.`);
}

async function rotate(e) {
  e.preventDefault();
  clearError();
  const sub = editing;
  const typed = $('sr-grace').value.trim();
  const hours = Number(typed);
  if (!typed || !Number.isFinite(hours) || hours < 0) {
    say($('sf-error'), 'Old secret kept for: give a number of hours (0 ends it at once).', true);
    $('sr-grace').setAttribute('aria-invalid', 'true');
    $('sr-grace').focus();
    return;
  }
  const what = sub.kind === 'pull' ? 'token' : 'signing secret';
  const keeps = sub.kind === 'pull' ? 'keeps opening its routes' : 'keeps signing beside it';
  const text = `A new ${what} is made for ${sub.name}. The old one ${keeps} for ${hours} ` +
    `hour${hours === 1 ? '' : 's'}, then stops: give the new one to ` +
    `${sub.kind === 'pull' ? 'its workers' : 'its receiver'} before then.`;
  if (!(await confirmDialog({ title: `Rotate the ${what} of ${sub.name}?`, text,
    confirmLabel: 'Rotate' }))) {
    $('sr-submit').focus();
    return;
  }
  try {
    const rotated = await api(`/subscriptions/${segment(sub.name)}/rotate-secret`,
      { method: 'POST', body: { grace_seconds: Math.round(hours * 3600) } });
    const until = new Date(rotated.previous_valid_until).toLocaleString();
    close();
    showSecret(`The new ${what} of ${sub.name}`, rotated.signing_secret ?? rotated.token,
      `${secretNote(sub)} The old one works until ${until}.`);
    await changed(`Rotated the ${what} of ${sub.name}.`);
  } catch (err) {
    // 409: a secret a node's config gives, or a kind without one; 422: the grace's bounds.
    say($('sf-error'), err.message, true);
  }
}

/** `onChange(message)` reloads the view after a create, a change or a rotation. */
export function setup(onChange) {
  changed = onChange;
  $('subscriptions-new').addEventListener('click', () => {
    if ($('sub-editor').hidden || editing) openNew();
    else close();
  });
  $('sf-cancel').addEventListener('click', () => { close(); $('subscriptions-new').focus(); });
  input('kind').addEventListener('change', showKindFields);
  preview.setup({ route, rules, showError, ruleError, clearError });
  $('sub-secret-done').addEventListener('click', hideSecret);
  $('sub-rotate').addEventListener('submit', rotate);
  $('sub-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    clearError();
    $('sf-submit').disabled = true;
    try {
      await (editing ? save() : create());
    } catch (err) {
      showError(err);
    } finally {
      $('sf-submit').disabled = false;
    }
  });
  // Leaving the view takes a shown secret off the screen.
  window.addEventListener('hashchange', () => {
    if (!location.hash.startsWith('#subscriptions')) hideSecret();
  });
}
