// The subscription editor of the subscriptions view: a new subscription (POST), a change to one
// (PATCH with only the fields changed, so that a field nobody touched is never rewritten from a
// stale page), and a rotation of its secret. The API checks every field with the config's own
// check; a refusal is shown beside the form, which keeps what was typed. A generated secret is
// shown once, on this page only, and kept nowhere.

import { api, segment } from './api.js';
import { $, say, confirmDialog, copyButton } from './dom.js';

const HTTP_ONLY = ['url', 'timeout_ms', 'concurrency', 'rate_per_second', 'ca_file'];
const LISTS = ['sources', 'types'];
const NUMBERS = ['max_attempts', 'backoff_base_ms', 'backoff_max_ms', 'timeout_ms', 'concurrency',
  'rate_per_second'];
const FIELDS = [...LISTS, 'mode', ...NUMBERS, 'ordered_by', 'on_failure', 'url', 'ca_file'];

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

/** Every field of the form as the API's JSON (null: not given, the default). */
function formValues() {
  const v = {};
  for (const f of LISTS) v[f] = listOf(input(f).value);
  for (const f of NUMBERS) v[f] = numberOf(input(f).value);
  for (const f of ['mode', 'ordered_by', 'url', 'ca_file']) v[f] = input(f).value.trim() || null;
  // on_failure means something only with ordered_by; alone the API refuses it.
  v.on_failure = v.ordered_by ? input('on_failure').value : null;
  return v;
}

/** The fields of a kind: the http-only ones for `http` alone. */
function applies(kind, field) {
  return kind === 'http' || !HTTP_ONLY.includes(field);
}

/** A subscription's current fields as `formValues` reads them, from its view. */
function currentValues(sub) {
  const v = { sources: sub.route.sources, types: sub.route.types, mode: sub.mode, url: null,
    on_failure: sub.ordered_by ? sub.on_failure : null, ordered_by: sub.ordered_by ?? null,
    ca_file: sub.ca_file ?? null };
  for (const f of NUMBERS) v[f] = sub[f] ?? null;
  return v;
}

function fill(values) {
  for (const f of LISTS) input(f).value = values[f] ? values[f].join(', ') : '';
  for (const f of [...NUMBERS, 'mode', 'ordered_by', 'url', 'ca_file']) {
    input(f).value = values[f] == null ? '' : String(values[f]);
  }
  input('on_failure').value = values.on_failure ?? 'hold';
}

function showKindFields() {
  $('sf-http').hidden = input('kind').value !== 'http';
}

function clearError() {
  say($('sf-error'), '');
  for (const el of $('sub-editor').querySelectorAll('[aria-invalid]')) {
    el.removeAttribute('aria-invalid');
  }
}

/** The API's refusal beside the form; the field it names (`url: …`) marked and focused. */
function showError(e) {
  say($('sf-error'), e.message, true);
  const named = /^([a-z_]+)/.exec(e.message)?.[1];
  const field = e.status === 409 ? input('name') : named && FIELDS.includes(named) && input(named);
  if (field) {
    field.setAttribute('aria-invalid', 'true');
    field.focus();
  }
}

function open(title, hint) {
  clearError();
  $('sub-form-title').textContent = title;
  $('sub-form-hint').textContent = hint;
  $('sub-editor').hidden = false;
  $('subscriptions-new').setAttribute('aria-expanded', 'true');
  showKindFields();
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
  $('sf-url-hint').textContent = sub.url_origin
    ? `Now calls ${sub.url_origin} (the whole URL is never shown: it may hold a credential). ` +
      'Leave empty to keep it; a URL typed here replaces it.'
    : 'Leave empty to keep it.';
  $('sf-submit').textContent = 'Save changes';
  $('sub-rotate').hidden = !['http', 'pull'].includes(sub.kind);
  const hint = sub.origin === 'config'
    ? `${sub.name} comes from a node's config. Once changed here it is made through the API: ` +
      'the config no longer changes it.'
    : 'Only the fields you change are sent. The secret changes by rotation, below.';
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
