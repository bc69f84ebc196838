// Events by status (each once, GET /events/stats), the oldest pending age, the deliveries
// refused in the last hour (GET /rejections), the subscriptions paused or probing
// (GET /subscriptions), and events received per minute.
// The view refreshes itself every 5 s while it is shown and the tab is visible (a hidden tab
// makes no calls); the checkbox turns that off.

import { api, query } from './api.js';
import { h, $, clear, age, say } from './dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const EVERY_MS = 5000;
const STATUSES = ['pending', 'claimed', 'completed', 'failed'];

let active = false; // the overview is the view shown
let timer = null;
let generation = 0; // a slow answer is dropped when a newer one was asked for
let minutes = null; // the last series drawn, redrawn when the width changes

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  el.append(...children);
  return el;
}

const clock = (iso) => new Date(iso).toLocaleTimeString([], { hour: 'numeric', minute: '2-digit' });

/** Round tick values for the count axis: 0 up to a round maximum, at most 5 steps. */
function ticks(max) {
  if (max <= 5) return Array.from({ length: Math.max(max, 1) + 1 }, (_, i) => i);
  const rough = max / 4;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough);
  const top = Math.ceil(max / step) * step;
  return Array.from({ length: top / step + 1 }, (_, i) => i * step);
}

/** The plot's width in CSS pixels: the figure's content box (600 while it is not laid out). */
function plotWidth() {
  const fig = $('chart');
  const style = getComputedStyle(fig);
  const width = fig.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return width > 100 ? Math.floor(width) : 600;
}

/**
 * Bars drawn with SVG attributes (no style attributes: the CSP allows none), at the figure's
 * real width so the labels are not stretched: counts on the y axis, local times on the x axis.
 */
function chart(series) {
  const counts = series.map((m) => m.count);
  const max = Math.max(0, ...counts);
  const total = counts.reduce((n, c) => n + c, 0);
  const width = plotWidth(), height = 200;
  const left = 44, right = 20, top = 24, bottom = 28;
  const plotW = width - left - right, plotH = height - top - bottom;
  const ys = ticks(max);
  const yMax = ys[ys.length - 1];
  const y = (count) => top + plotH - (count / yMax) * plotH;
  const step = plotW / series.length;
  // A time label every 10 minutes, every 20 when narrow.
  const every = plotW < 420 ? 20 : 10;

  const grid = ys.map((v) => [
    svg('line', { x1: left, y1: y(v), x2: left + plotW, y2: y(v), class: v === 0 ? 'axis' : 'grid' }),
    svg('text', { x: left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'tick' }, String(v)),
  ]).flat();
  const times = series.flatMap((m, i) => {
    if (new Date(m.minute).getMinutes() % every !== 0) return [];
    const x = left + i * step + step / 2;
    const label = clock(m.minute);
    // Near an edge, the label ends (or starts) at its tick rather than crossing the edge.
    const half = label.length * 3.5;
    const anchor = x + half > width ? 'end' : (x - half < 0 ? 'start' : 'middle');
    return [
      svg('line', { x1: x, y1: top + plotH, x2: x, y2: top + plotH + 4, class: 'axis' }),
      svg('text', { x, y: height - 8, 'text-anchor': anchor, class: 'tick' }, label),
    ];
  });
  const bars = series.map((m, i) => {
    const title = document.createElementNS(SVG, 'title');
    title.textContent = `${clock(m.minute)}: ${m.count}`;
    return svg('rect', {
      x: left + i * step + 1, y: y(m.count), width: Math.max(1, step - 2),
      height: top + plotH - y(m.count), class: 'bar',
    }, title);
  });
  const busiest = series.reduce((best, m) => (m.count > best.count ? m : best), series[0] ?? { count: 0 });
  const span = series.length ? `from ${clock(series[0].minute)} to ${clock(series[series.length - 1].minute)}` : '';
  const summary = `Events received per minute, ${span}: ${total} in all` +
    (max > 0 ? `, at most ${max} in one minute (${clock(busiest.minute)}).` : '.');
  return [
    svg('svg', {
      viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': summary, class: 'plot',
    },
    svg('text', { x: 0, y: 12, class: 'axis-title' }, 'events per minute'),
    ...grid,
    svg('line', { x1: left, y1: top, x2: left, y2: top + plotH, class: 'axis' }),
    ...times, ...bars),
    h('figcaption', {}, `${total} event${total === 1 ? '' : 's'} received in the last hour. `,
      'Local times, oldest minute on the left; hover a bar for its count. ',
      'Each event counts once, at its first delivery.'),
  ];
}

function counts(c) {
  const list = $('counts');
  if (list.children.length !== STATUSES.length) {
    clear(list, STATUSES.map((k) => h('li', { class: `card status-${k}` },
      h('a', { href: `#events?status=${k}` },
        h('span', { class: 'count', 'data-status': k }), h('span', { text: k })))));
  }
  // Updated in place: a card link that has the keyboard focus keeps it.
  for (const k of STATUSES) list.querySelector(`.count[data-status="${k}"]`).textContent = String(c[k]);
}

/** Refusals of the last hour: one page of up to 500 is read; past that, "500 or more". */
async function refused() {
  const since = new Date(Date.now() - 3600 * 1000).toISOString();
  const page = await api('/rejections' + query({ received_after: since, limit: 500 }));
  const n = page.rejections.length;
  const text = `${n}${page.next_cursor ? ' or more' : ''} deliver${n === 1 ? 'y' : 'ies'} refused in the last hour`;
  clear($('overview-refused'), n ? h('a', { href: '#rejected', text }) : `${text}.`, n ? '.' : '');
}

/** The subscriptions that are not delivering: paused, or probing a failing endpoint. */
async function stalled() {
  const { subscriptions } = await api('/subscriptions');
  const odd = subscriptions.filter((s) => s.state === 'paused' || s.state === 'probing');
  const box = $('overview-subscriptions');
  if (!odd.length) {
    clear(box, h('p', { text: `All ${subscriptions.length} subscriptions are active.` }));
    return;
  }
  clear(box, h('p', {},
    h('a', { href: '#subscriptions', text: `${odd.length} subscription${odd.length === 1 ? '' : 's'} not delivering` }),
    ': ', ...odd.flatMap((s, i) => [i ? ', ' : '', h('span', { class: 'mono', text: s.name }),
      ` ${s.state}${s.lag ? ` (${s.lag} waiting)` : ''}`])));
}

let updated = null;
function updatedLine() {
  if (!updated) return;
  const auto = $('overview-auto').checked ? '; refreshes every 5 s while this tab is visible' : '';
  $('overview-updated').textContent = `Updated ${updated.toLocaleTimeString()}${auto}.`;
}

function schedule() {
  clearTimeout(timer);
  timer = null;
  if (active && $('overview-auto').checked && document.visibilityState === 'visible') {
    timer = setTimeout(() => refresh(false), EVERY_MS);
  }
}

/** One read of the stats; `asked` is a click on Refresh (said in the live region). */
async function refresh(asked) {
  const mine = ++generation;
  clearTimeout(timer);
  const status = $('overview-status');
  try {
    const s = await api('/events/stats');
    if (mine !== generation || !active) return;
    // Each extra is best effort: the counts stand without it.
    await Promise.all([refused().catch(() => {}), stalled().catch(() => {})]);
    if (mine !== generation || !active) return;
    counts(s.counts);
    $('oldest').textContent = s.oldest_pending_seconds === null
      ? 'No event is waiting.'
      : `Oldest pending event: waiting for ${age(s.oldest_pending_seconds)}.`;
    minutes = s.received_per_minute;
    clear($('chart'), chart(minutes));
    updated = new Date();
    updatedLine();
    // The live region speaks for a click or a failure only, not every 5 s.
    say(status, asked ? 'Refreshed.' : '');
  } catch (e) {
    if (mine === generation) say(status, `Could not load the overview: ${e.message}`, true);
  } finally {
    if (mine === generation) schedule();
  }
}

export function show() {
  active = true;
  return refresh(false);
}

/** Another view is shown: no more calls until the overview is back. */
export function hide() {
  active = false;
  clearTimeout(timer);
  timer = null;
}

export function setup() {
  $('overview-refresh').addEventListener('click', () => refresh(true));
  $('overview-auto').addEventListener('change', () => {
    updatedLine();
    if ($('overview-auto').checked && active) refresh(false);
    else schedule();
  });
  // A hidden tab makes no calls; shown again, it catches up at once.
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible' && active) refresh(false);
    else schedule();
  });
  let pending = false;
  window.addEventListener('resize', () => {
    if (pending || !active || !minutes) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; clear($('chart'), chart(minutes)); });
  });
}
