// Retry and force retry. The server decides: a plain retry of a completed or abandoned event
// answers 409 `conflict`, and only then, or when the event says so already, does the page offer
// a forced retry behind a confirmation. A forced retry is the one action that can repeat an
// effect, so only the event's own page offers it: the list shows `Retry` on failed events only.

import { api, eventPath, ApiError } from './api.js';
import { h, confirmDialog } from './dom.js';

/** Why a forced retry needs a second thought, in the words an operator needs. */
export function forceReason(event) {
  if (event.abandoned) {
    return `Event ${event.event_id} was abandoned: an at-most-once call to the downstream ` +
      'was cut off before its outcome was known, so the downstream may already have acted. ' +
      'A forced retry calls it again. Force it only if you checked that the downstream did ' +
      'not act, or acting twice is harmless.';
  }
  if (event.status === 'completed') {
    return `Event ${event.event_id} is already completed` +
      (event.outcome ? ` (outcome: ${event.outcome})` : '') + '. A forced retry runs its ' +
      'handler again: a loyalty credit is found and no points move, but a downstream ' +
      'submission really calls the downstream again.';
  }
  return `The server refused a plain retry of ${event.event_id}.`;
}

function needsForce(event) {
  return event.status === 'completed' || (event.status === 'failed' && event.abandoned);
}

/**
 * The buttons for one event: `Retry` for a failed one and, when `force` is set (the event's
 * page), `Force retry` where the API needs `force=true`. `onChange(event)` gets the event as
 * the server answered it; `onError(text)` gets a failure to show; `onConflict(error)`, when
 * forced retries are not offered here, gets the server's 409.
 */
export function retryButtons(event, {
  onChange, onError, onConflict, force: offerForce = false, subscription,
}) {
  // With a subscription, `event` is that subscription's state of the event (its status,
  // abandoned and outcome), and the retry is of that state alone.
  const name = `${event.source}/${event.event_id}` + (subscription ? ` in ${subscription}` : '');
  const confirmForce = async (text) => confirmDialog({
    title: `Force retry ${name}?`, text, confirmLabel: 'Force retry',
  });
  const run = async (force, button) => {
    button.disabled = true;
    try {
      const params = new URLSearchParams();
      if (subscription) params.set('subscription', subscription);
      if (force) params.set('force', 'true');
      const path = eventPath(event.source, event.event_id) + '/retry' +
        (params.size ? `?${params}` : '');
      onChange(await api(path, { method: 'POST' }));
    } catch (e) {
      button.disabled = false;
      if (!force && e instanceof ApiError && e.code === 'conflict' && !offerForce) {
        // The event changed since it was shown; a forced retry is for its own page.
        if (onConflict) return onConflict(e);
        onError(`Retry of ${name} refused: ${e.message}. Open the event to force a retry.`);
        return;
      }
      if (!force && e instanceof ApiError && e.code === 'conflict') {
        // The event changed since it was shown (abandoned or completed): offer a forced retry.
        if (await confirmForce(`${e.message}. A forced retry runs the handler again; one that ` +
            'calls the downstream calls it again, and the downstream may act twice.')) {
          return run(true, button);
        }
        button.focus();
        return;
      }
      onError(`Retry of ${name} failed: ${e.message}`);
    }
  };
  const retry = async (force, button) => {
    if (force && !(await confirmForce(forceReason(event)))) { button.focus(); return; }
    await run(force, button);
  };
  const buttons = [];
  if (event.status === 'failed' && !event.abandoned) {
    const b = h('button', { type: 'button', 'aria-label': `Retry ${name}`, text: 'Retry' });
    b.addEventListener('click', () => retry(false, b));
    buttons.push(b);
  }
  if (offerForce && needsForce(event)) {
    const b = h('button', { type: 'button', class: 'danger', 'aria-label': `Force retry ${name}`, text: 'Force retry' });
    b.addEventListener('click', () => retry(true, b));
    buttons.push(b);
  }
  return buttons;
}
