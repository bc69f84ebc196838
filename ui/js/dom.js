// Building the page from text: every value from the server becomes a text node or an
// attribute value, never markup. Delivery bodies are attacker-controlled.

/** `h('td', {class: 'x'}, 'text', child)`: an element with attributes and children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') el.textContent = String(v);
    else if (k.startsWith('on')) { if (typeof v === 'function') el.addEventListener(k.slice(2), v); }
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export const $ = (id) => document.getElementById(id);

/**
 * A time in the viewer's local time, with the UTC time on hover. `compact` (for lists): today's
 * times without their date, others with a short date; both to the millisecond. The hover has
 * the whole time.
 */
export function time(iso, { compact = false } = {}) {
  if (!iso) return h('span', { class: 'muted', text: '—' });
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return document.createTextNode(iso);
  let text = d.toLocaleString();
  if (compact) {
    // Milliseconds kept: events and refusals a few ms apart are told apart, and figures of one
    // width (tabular-nums, in the stylesheet) align them down a column.
    const clock = { hour: '2-digit', minute: '2-digit', second: '2-digit', fractionalSecondDigits: 3 };
    text = d.toDateString() === new Date().toDateString()
      ? d.toLocaleTimeString([], clock)
      : d.toLocaleString([], { year: '2-digit', month: '2-digit', day: '2-digit', ...clock });
  }
  const title = compact ? `${d.toLocaleString()}, ${d.toISOString()} (UTC)` : `${d.toISOString()} (UTC)`;
  return h('time', { datetime: iso, title, text });
}

/** `2026-12-04T05:46:55` in local time: what a datetime-local input takes. */
export function localInput(iso) {
  const d = new Date(iso ?? '');
  if (Number.isNaN(d.getTime())) return '';
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}` +
    `T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A datetime-local input's value (local time) as RFC 3339 UTC, as the API takes it. */
export function utcOf(value) {
  const d = value ? new Date(value) : null;
  return d && !Number.isNaN(d.getTime()) ? d.toISOString() : undefined;
}

/** One line, cut with an ellipsis when the column is narrower; the whole text on hover. */
export function clipped(text, cls = '') {
  return h('span', { class: 'shrink' }, h('span', { class: `clip ${cls}`.trim(), title: text, text }));
}

/** "3 h 4 min", "12 s": an age for people. */
export function age(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  const hrs = Math.floor(m / 60);
  if (hrs < 48) return `${hrs} h ${m % 60} min`;
  return `${Math.floor(hrs / 24)} days ${hrs % 24} h`;
}

export function statusBadge(event) {
  const label = event.abandoned ? `${event.status} (abandoned)` : event.status;
  return h('span', { class: `badge status-${event.status}`, text: label });
}

/** Show a message in a live region; `error` styles it as a failure. */
export function say(el, message, error = false) {
  el.textContent = message;
  el.classList.toggle('error', error);
  el.hidden = !message;
}

/**
 * Ask before acting: the native dialog traps focus, and Escape closes it (as a cancel).
 * Answers true only for the confirm button.
 */
export function confirmDialog({ title, text, confirmLabel }) {
  const dialog = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-text').textContent = text;
  $('confirm-ok').textContent = confirmLabel;
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
    dialog.querySelector('button[value="cancel"]').focus();
  });
}

/**
 * A small `Copy` button that puts `text` on the clipboard and says so in `status`. The
 * clipboard API exists only on HTTPS and localhost pages; elsewhere the text is shown instead,
 * to be selected by hand.
 */
export function copyButton(text, label, status) {
  const button = h('button', { type: 'button', class: 'copy', 'aria-label': label, title: `${label}: ${text}`, text: 'Copy' });
  button.addEventListener('click', async () => {
    try {
      if (!navigator.clipboard) throw new Error('this page is not on HTTPS or localhost');
      await navigator.clipboard.writeText(text);
      say(status, `Copied ${text} to the clipboard.`);
    } catch (e) {
      say(status, `Could not copy (${e.message}); the full text is: ${text}`, true);
    }
  });
  return button;
}
