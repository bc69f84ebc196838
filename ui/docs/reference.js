// A reference of GET /openapi.json, built with text nodes only (descriptions and answers are
// shown as text, never parsed as markup), and a form per operation to try it with a token.

import { h, clear, $ } from '/ui/js/dom.js';

const KEY = 'webhook-inbox.admin-token';

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
      if (where === 'path') url = url.replace(`{${input.name}}`, encodeURIComponent(input.value));
      else if (where === 'query') query.set(input.name, input.value);
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

function operation(doc, path, method, op) {
  const id = `${method}-${path}`.replace(/[^a-zA-Z0-9]+/g, '-');
  const params = (op.parameters ?? []).map((p) => h('tr', {},
    h('td', {}, h('code', { text: p.name })), h('td', { text: p.in }),
    h('td', { text: p.schema?.type ?? '' }), h('td', { text: p.description ?? '' })));
  const responses = Object.entries(op.responses ?? {}).map(([code, r]) => {
    const content = Object.entries(r.content ?? {});
    return h('details', {}, h('summary', { text: `${code} ${r.description ?? ''}` }),
      ...content.map(([type, c]) => h('div', {}, h('p', { text: type }),
        h('pre', { text: schemaText(doc, c.schema) }))));
  });
  const body = op.requestBody
    ? Object.entries(op.requestBody.content ?? {}).map(([type, c]) =>
      h('details', {}, h('summary', { text: `Request body: ${type}` }),
        h('pre', { text: schemaText(doc, c.schema) })))
    : [];
  return h('section', { class: 'op', id, 'aria-labelledby': `${id}-h` },
    h('h2', { id: `${id}-h` }, h('span', { class: 'method', text: method }), path),
    op.security ? h('p', { text: 'Needs a bearer token.' }) : null,
    h('p', { text: op.summary ?? '' }), h('p', { text: op.description ?? '' }),
    params.length ? h('table', {}, h('tr', {}, ...['name', 'in', 'type', 'description']
      .map((t) => h('th', { text: t }))), ...params) : null,
    ...body, h('h3', { text: 'Answers' }), ...responses,
    h('details', {}, h('summary', { text: 'Try it' }), tryForm(path, method, op)));
}

async function main() {
  const input = $('token');
  input.value = sessionStorage.getItem(KEY) ?? '';
  input.addEventListener('input', () => sessionStorage.setItem(KEY, input.value));
  const doc = await (await fetch('/openapi.json')).json();
  $('title').textContent = `${doc.info.title} ${doc.info.version} · API reference`;
  $('intro').textContent = doc.info.description ?? '';
  const ops = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) ops.push(operation(doc, path, method, op));
  }
  clear($('toc'), ...ops.map((s) => h('a', { href: `#${s.id}`, text: s.querySelector('h2').textContent })));
  clear($('operations'), ...ops);
}

main();
