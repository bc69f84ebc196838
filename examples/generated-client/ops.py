"""Ops and submission flows through a Python client generated from webhook-inbox's own API
document, as a user would make one:

    pip install openapi-python-client
    curl -s http://127.0.0.1:8080/openapi.json > openapi.json
    openapi-python-client generate --path openapi.json --meta none \
        --output-path webhook_inbox_client
    python ops.py http://127.0.0.1:8080 ADMIN_TOKEN SUBMISSION_TOKEN CUSTOMER_ID

It lists the failed events, shows the first, retries it, looks up a customer's balance, then
creates a request and submits it twice (queued, then duplicate). Each step checks its answer and
the script exits non-zero on the first surprise; the last line printed is the summary.
"""

import sys

from webhook_inbox_client import AuthenticatedClient
from webhook_inbox_client.api.ops import (
    get_event,
    get_loyalty_account,
    list_events,
    retry_event,
)
from webhook_inbox_client.api.requests import create_request, submit_request
from webhook_inbox_client.models import (
    ErrorBody,
    Event,
    EventPage,
    EventWithHistory,
    Loyalty,
    NewRequest,
    Request,
    StatusFilter,
    Submitted,
)


def expect(answer, kind):
    if not isinstance(answer, kind):
        sys.exit(f"expected {kind.__name__}, got {answer!r}")
    return answer


def main(base_url, admin_token, submission_token, customer_id):
    ops = AuthenticatedClient(base_url=base_url, token=admin_token, raise_on_unexpected_status=True)
    failed = expect(list_events.sync(client=ops, status=StatusFilter.FAILED), EventPage)
    if not failed.events:
        sys.exit("no failed event to retry")
    first = failed.events[0]
    detail = expect(get_event.sync(first.source, first.event_id, client=ops), EventWithHistory)
    print(f"failed: {detail.source}/{detail.event_id}: {detail.last_error}")
    retried = expect(retry_event.sync(first.source, first.event_id, client=ops), Event)
    print(f"retried: now {retried.status}")
    account = expect(get_loyalty_account.sync(customer_id, client=ops), Loyalty)
    print(f"balance of {customer_id}: {account.balance}")

    # Submissions take a submission token (or the admin token).
    client = AuthenticatedClient(base_url=base_url, token=submission_token)
    # The body is optional; this generator sends its "unset" marker unless one is given.
    request = expect(create_request.sync(client=client, body=NewRequest()), Request)
    first_submit = expect(submit_request.sync(request.id, client=client), Submitted)
    again = expect(submit_request.sync(request.id, client=client), Submitted)
    unknown = expect(submit_request.sync("no-such-request", client=client), ErrorBody)
    print(f"request {request.id}: {first_submit.status}, then {again.status}; "
          f"unknown: {unknown.error}")
    print(f"summary: retried={retried.status} balance={account.balance} "
          f"submit={first_submit.status},{again.status} unknown={unknown.error}")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
