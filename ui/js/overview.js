// Counts by status, the oldest pending age, and events received per minute (GET /events/stats).

import { api } from './api.js';
import { h, $, clear, age, say } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  el.append(...children);
  return el;
}

/** Bars drawn with SVG attributes (no style attributes: the CSP allows none). */
function chart(minutes) {
  const max = Math.max(1, ...minutes.map((m) => m.count));
  const total = minutes.reduce((n, m) => n + m.count, 0);
  const width = 600, height = 120, step = width / minutes.length;
  const bars = minutes.map((m, i) => {
    const barHeight = (m.count / max) * (height - 4);
    const label = `${new Date(m.minute).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })}: ${m.count}`;
    const title = document.createElementNS(SVG, 'title');
    title.textContent = label;
    return svg('rect', { x: i * step + 1, y: height - barHeight, width: Math.max(1, step - 2), height: barHeight, class: 'bar' }, title);
  });
  const summary = `${total} event${total === 1 ? '' : 's'} received in the last hour, ` +
    `at most ${max === 1 && total === 0 ? 0 : max} in one minute.`;
  return [
    svg('svg', { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': summary, class: 'bars' },
      svg('line', { x1: 0, y1: height, x2: width, y2: height, class: 'axis' }), ...bars),
    h('figcaption', {}, summary, ' Oldest minute on the left; hover a bar for its count. ',
      'Each event counts once, at its first delivery.'),
  ];
}

export async function show() {
  const status = $('overview-status');
  say(status, 'Loading…');
  try {
    const s = await api('/events/stats');
    clear($('counts'), ['pending', 'claimed', 'completed', 'failed'].map((k) =>
      h('li', { class: `card status-${k}` },
        h('a', { href: `#events?status=${k}` },
          h('span', { class: 'count', text: String(s.counts[k]) }), h('span', { text: k })))));
    $('oldest').textContent = s.oldest_pending_seconds === null
      ? 'No event is waiting.'
      : `Oldest pending event: waiting for ${age(s.oldest_pending_seconds)}.`;
    clear($('chart'), chart(s.received_per_minute));
    say(status, `Updated ${new Date().toLocaleTimeString()}.`);
  } catch (e) {
    say(status, `Could not load the overview: ${e.message}`, true);
  }
}

export function setup() {
  $('overview-refresh').addEventListener('click', show);
}
