// Sign-in, sign-out and the views behind the URL's fragment: #overview, #events (with its
// filters: #events?status=failed&source=shop), #event/<source>/<id>, #subscriptions,
// #rejected (with its
// filters: #rejected?reason=invalid_signature), #loyalty, #requests, #request/<id>. The
// fragment never holds the token.

import { api, token, whenUnauthorized } from './api.js';
import { $, say } from './dom.js';
import * as overview from './overview.js';
import * as events from './events.js';
import * as detail from './detail.js';
import * as lookups from './lookups.js';
import * as subscriptions from './subscriptions.js';
import { hideSecret } from './subscription_form.js';

const VIEWS = ['login', 'overview', 'events', 'event', 'subscriptions', 'rejected', 'loyalty',
  'requests'];

function showView(name) {
  // Focus moves to the heading only when the view changes: applying filters keeps it.
  const changed = $(`view-${name}`).hidden;
  if (name !== 'overview') overview.hide();
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== name;
  const signedIn = name !== 'login';
  $('nav').hidden = !signedIn;
  $('logout').hidden = !signedIn;
  const section = name === 'event' ? 'events' : name;
  for (const a of $('nav').querySelectorAll('a')) {
    if (a.getAttribute('href') === `#${section}`) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const heading = $(`view-${name}`).querySelector('h1');
  document.title = `${heading.textContent} · webhook-inbox`;
  if (changed) heading.focus({ preventScroll: false });
}

function signOut(message) {
  token.clear();
  hideSecret();
  $('token').value = '';
  showView('login');
  say($('login-error'), message ?? '', Boolean(message));
  $('token').focus();
}

async function route() {
  if (!token.get()) return signOut();
  const [path, search] = location.hash.slice(1).split('?');
  const parts = path.split('/').map(decodeURIComponent);
  switch (parts[0]) {
    case 'events':
      showView('events');
      return events.show(search);
    case 'event':
      if (parts.length >= 3) {
        $('back-to-events').href = events.lastListHash();
        showView('event');
        return detail.load(parts[1], parts.slice(2).join('/'));
      }
      break;
    case 'subscriptions':
      showView('subscriptions');
      return subscriptions.show();
    case 'rejected':
      showView('rejected');
      return lookups.showRejected(search);
    case 'loyalty':
      showView('loyalty');
      return;
    case 'requests':
      showView('requests');
      return lookups.showRequests();
    case 'request':
      showView('requests');
      await lookups.showRequests();
      return lookups.showRequest(parts.slice(1).join('/'));
    default:
      break;
  }
  showView('overview');
  return overview.show();
}

async function signIn(e) {
  e.preventDefault();
  const given = $('token').value.trim();
  const error = $('login-error');
  if (!given) return;
  try {
    // Any admin route tells whether the token is right; the overview is needed next anyway.
    await api('/events/stats', { tokenOverride: given });
  } catch (err) {
    say(error, err.status === 401
      ? 'Wrong token: the server refused it. Check the admin token and try again.'
      : `Could not sign in: ${err.message}`, true);
    $('token').select();
    return;
  }
  token.set(given);
  $('token').value = '';
  say(error, '');
  if (!location.hash || location.hash === '#') location.hash = '#overview';
  else route();
}

whenUnauthorized(() => signOut('The server refused the token (it may have changed). Sign in again.'));
$('login-form').addEventListener('submit', signIn);
// Only now may the form be submitted: before, Enter would have sent it without this handler.
$('login-form').querySelector('button[type=submit]').disabled = false;
$('logout').addEventListener('click', () => { signOut(); history.replaceState(null, '', '#'); });
window.addEventListener('hashchange', route);
overview.setup();
events.setup();
lookups.setup();
subscriptions.setup();
route();
