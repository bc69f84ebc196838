// A reference of GET /openapi.json, built as DOM nodes only (descriptions are Markdown made
// into nodes by markdown.js, answers are text, nothing is parsed as markup), and a form per
// operation to try it with a token. The routes a provider or an integrator needs come first;
// the files of the pages themselves (`/ui/{asset}`, `/docs/{asset}`) are not listed.

import { h, clear, $ } from '/ui/js/dom.js';
import { inline, markdown } from './markdown.js';

const KEY = 'webhook-inbox.admin-token';

/** Who reads which tag, in the order of their first hour: providers, integrators, ops. */
const GROUPS = [
  ['ingest', 'Receiving webhooks (providers)'],
  ['requests', 'Submitting requests (integrators)'],
  ['ops', 'Operating: events, retries, balances (admin token)'],
  ['open', 'Health, metrics and this document'],
];

/** Within a group, the order a newcomer uses them in; routes not named here follow. */
const FIRST = [
  'POST /webhooks/{source}',
  'POST /requests', 'POST /requests/{id}/documents', 'POST /requests/{id}/submit', 'GET /requests/{id}',
  'GET /events', 'GET /events/{source}/{event_id}', 'POST /events/{source}/{event_id}/retry',
  'POST /events/retry', 'GET /events/stats', 'GET /loyalty/{customer_id}', 'GET /events/export',
  'POST /events/purge', 'POST /events/run',
  'GET /healthz', 'GET /readyz', 'GET /metrics', 'GET /openapi.json',
];

/** The files the pages load: served, but of no use to a client. */
const isAsset = (path) => path.endsWith('/{asset}');

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'];

function resolve(doc, schema) {
  const ref = schema && schema.$ref;
  return ref ? doc.components.schemas[ref.split('/').pop()] : schema;
}

function schemaText(doc, schema, depth = 0) {
  // Inline one level of references so the shape is readable without hopping around.
  const seen = JSON.parse(JSON.stringify(schema ?? {}));
  if (depth < 2) {
    const walk = (node, d) => {
      if (!node || typeof node !== 'object') return node;
      if (node.$ref && d < 3) return walk(JSON.parse(JSON.stringify(resolve(doc, node))), d + 1);
      for (const k of Object.keys(node)) node[k] = walk(node[k], d);
      return node;
    };
    return JSON.stringify(walk(seen, 0), null, 2);
  }
  return JSON.stringify(seen, null, 2);
}

function tryForm(path, method, op) {
  const params = op.parameters ?? [];
  const fields = params.map((p) => {
    const id = `${method}-${path}-${p.in}-${p.name}`;
    return h('div', {}, h('label', { for: id, text: `${p.name} (${p.in})` }),
      h('input', { id, name: p.name, 'data-in': p.in, required: p.required || undefined }));
  });
  const bodyId = `${method}-${path}-body`;
  const body = op.requestBody
    ? [h('label', { for: bodyId, text: 'Body' }), h('textarea', { id: bodyId, rows: 4 })]
    : [];
  const result = h('pre', { role: 'status' });
  const form = h('form', { class: 'try' }, ...fields, ...body,
    h('button', { type: 'submit', text: `Send ${method.toUpperCase()}` }), result);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    let url = path;
    const query = new URLSearchParams();
    const headers = {};
    for (const input of form.querySelectorAll('input')) {
      if (!input.value) continue;
      const where = input.getAttribute('data-in');
      if (where === 'path') {
        try { url = url.replace(`{${input.name}}`, segment(input.value)); } catch (err) {
          result.textContent = err.message;
          return;
        }
      } else if (where === 'query') query.set(input.name, input.value);
      else if (where === 'header') headers[input.name] = input.value;
    }
    const token = sessionStorage.getItem(KEY);
    if (token && op.security) headers.Authorization = `Bearer ${token}`;
    const text = body.length ? form.querySelector('textarea').value : undefined;
    if (text) headers['Content-Type'] = 'application/json';
    const qs = query.toString();
    try {
      const r = await fetch(qs ? `${url}?${qs}` : url,
        { method: method.toUpperCase(), headers, body: text || undefined, credentials: 'omit' });
      result.textContent = `${r.status} ${r.statusText}\n${await r.text()}`;
    } catch (err) {
      result.textContent = `No answer: ${err.message}`;
    }
  });
  return form;
}

/** One path segment. A browser drops a segment `.` or `..` (escaped as `%2E` too) before the
 * request leaves, which would send the call to another route: such a value is refused, as the
 * dashboard's api.js does. */
function segment(text) {
  if (/^\.+$/.test(text)) throw new Error(`"${text}" is made only of dots and cannot be a path segment`);
  return encodeURIComponent(text);
}

function operation(doc, { path, method, op, label }) {
  const id = `${method}-${path}`.replace(/[^a-zA-Z0-9]+/g, '-');
  const params = (op.parameters ?? []).map((p) => h('tr', {},
    h('td', {}, h('code', { text: p.name })), h('td', { text: p.in }),
    h('td', { text: p.schema?.type ?? '' }), h('td', { class: 'desc' }, inline(p.description))));
  const responses = Object.entries(op.responses ?? {}).map(([code, r]) => {
    const content = Object.entries(r.content ?? {});
    return h('details', {}, h('summary', {}, `${code} `, inline(r.description)),
      ...content.map(([type, c]) => h('div', {}, h('p', { text: type }),
        h('pre', { text: schemaText(doc, c.schema) }))));
  });
  const body = op.requestBody
    ? Object.entries(op.requestBody.content ?? {}).map(([type, c]) =>
      h('details', {}, h('summary', { text: `Request body: ${type}` }),
        h('pre', { text: schemaText(doc, c.schema) })))
    : [];
  return h('section', { class: 'op', id, 'aria-labelledby': `${id}-h` },
    h('h3', { id: `${id}-h` }, h('span', { class: 'method', text: method.toUpperCase() }), ' ',
      h('span', { class: 'path', text: path })),
    op.security ? h('p', { class: 'muted', text: 'Needs a bearer token.' }) : null,
    h('div', { class: 'desc' }, markdown(op.summary), markdown(op.description)),
    params.length ? h('div', { class: 'scroll' }, h('table', {},
      h('caption', { class: 'sr-only', text: `Parameters of ${label}` }),
      h('tr', {}, ...['name', 'in', 'type', 'description'].map((t) => h('th', { scope: 'col', text: t }))),
      ...params)) : null,
    ...body, h('h4', { text: 'Answers' }), ...responses,
    h('details', {}, h('summary', { text: `Try ${label}` }), tryForm(path, method, op)));
}

/** Every operation but the pages' files, grouped by tag, in reading order. */
function ordered(doc) {
  const ops = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    if (isAsset(path)) continue;
    for (const [method, op] of Object.entries(item)) {
      if (!METHODS.includes(method)) continue;
      const label = `${method.toUpperCase()} ${path}`;
      const rank = FIRST.indexOf(label);
      ops.push({ path, method, op, label, tag: op.tags?.[0] ?? 'other', rank: rank < 0 ? FIRST.length : rank });
    }
  }
  ops.sort((a, b) => a.rank - b.rank); // stable: unnamed routes keep the document's order
  const described = new Map((doc.tags ?? []).map((t) => [t.name, t.description]));
  const groups = GROUPS.map(([tag, title]) => ({ tag, title }));
  for (const o of ops) {
    if (!groups.some((g) => g.tag === o.tag)) groups.push({ tag: o.tag, title: o.tag });
  }
  return groups
    .map((g) => ({ ...g, description: described.get(g.tag), ops: ops.filter((o) => o.tag === g.tag) }))
    .filter((g) => g.ops.length);
}

async function main() {
  const input = $('token');
  input.value = sessionStorage.getItem(KEY) ?? '';
  input.addEventListener('input', () => sessionStorage.setItem(KEY, input.value));
  const doc = await (await fetch('/openapi.json')).json();
  $('title').textContent = `${doc.info.title} ${doc.info.version} · API reference`;
  clear($('intro'), markdown(doc.info.description));
  const groups = ordered(doc).map((g) => {
    const sections = g.ops.map((o) => ({ label: o.label, section: operation(doc, o) }));
    const id = `group-${g.tag}`.replace(/[^a-zA-Z0-9]+/g, '-');
    return {
      toc: h('li', {}, h('a', { href: `#${id}`, class: 'group', text: g.title }),
        h('ul', {}, sections.map((s) => h('li', {}, h('a', { href: `#${s.section.id}`, text: s.label }))))),
      body: h('section', { class: 'op-group', id, 'aria-labelledby': `${id}-h` },
        h('h2', { id: `${id}-h`, text: g.title }),
        g.description ? h('div', { class: 'muted' }, markdown(g.description)) : null,
        g.tag === 'open' ? h('p', {}, 'Also served, with the files they load: ',
          h('a', { href: '/ui/', text: 'the ops dashboard at /ui/' }), ' and ',
          h('a', { href: '/docs/', text: 'this page at /docs/' }), '.') : null,
        sections.map((s) => s.section)),
    };
  });
  clear($('toc'), h('ul', {}, groups.map((g) => g.toc)));
  clear($('operations'), groups.map((g) => g.body));
}

main();
