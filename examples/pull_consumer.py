"""A webhook-inbox pull consumer that applies each event exactly once. Standard library only.

A `pull` subscription hands events to workers that ask for them: no port to open, any number of
copies, stopped and started at will. Each claim is leased; an event not acknowledged before its
lease ends is claimed again, by this worker or another. So the same event can reach your code
twice (a crash after your commit and before the ack, a lease that ran out), and this worker makes
its *effect* happen once anyway:

  * Dedup on the event's key (`source`, `event_id`) and on the business key (`order_id`, which a
    sender may repeat under a new event id), both in ONE SQLite transaction with the effect.
  * The check and the act are one statement: `INSERT ... ON CONFLICT DO NOTHING`, then look at
    the row count; never "SELECT, then INSERT if absent", which two workers race.
  * Commit first, then ack. A crash between the two only means the event comes again, and the
    dedup row answers it.
  * A duplicate is a success: ack it `done`, or it would come back until its attempts run out.

Run it (the token is the subscription's `token`, or the file `data/subscription-NAME-token`):

    python3 examples/pull_consumer.py --url http://127.0.0.1:8080 --subscription orders \
        --token "$(cat data/subscription-orders-token)" --db consumer.db

An `order.completed` event whose JSON has `order_id`, `customer_id` and `points` (at the top
level or under `data`) credits the points to the customer's balance; every other event is only
recorded. An event it cannot read is acked `fail` (ops see it, fix the cause, and retry it). It
stops cleanly on SIGTERM or SIGINT, giving back the claims it has not applied.
"""

import argparse, json, signal, sqlite3, sys, time, urllib.error, urllib.request

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_events (
    source TEXT NOT NULL, event_id TEXT NOT NULL, event_type TEXT, outcome TEXT NOT NULL,
    processed_at REAL NOT NULL, PRIMARY KEY (source, event_id));
CREATE TABLE IF NOT EXISTS loyalty_credits (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, points INTEGER NOT NULL,
    source TEXT NOT NULL, event_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS loyalty_balances (
    customer_id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
"""


class Client:
    """The three calls of a pull subscription, over one keep-alive-free urllib opener."""

    def __init__(self, url, subscription, token, timeout):
        self.base = f"{url.rstrip('/')}/subscriptions/{subscription}"
        self.token, self.timeout = token, timeout

    def call(self, route, body, wait_s=0):
        req = urllib.request.Request(
            f"{self.base}/{route}", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.timeout + wait_s) as answer:
            return json.load(answer)

    def claim(self, max_events, lease_ms, wait_ms):
        body = {"max": max_events, "lease_ms": lease_ms, "wait_ms": wait_ms}
        return self.call("claim", body, wait_ms / 1000)["claims"]

    def ack(self, results):
        return self.call("ack", {"results": results})["results"]


def field(event, name):  # a field at the top level of the event, or else inside its `data`
    if name in event:
        return event[name]
    data = event.get("data")
    return data.get(name) if isinstance(data, dict) else None


def order_of(claim):
    """(order_id, customer_id, points) of an order.completed claim, or ValueError."""
    event = claim.get("body")
    if not isinstance(event, dict):
        raise ValueError("order.completed body is not a JSON object")
    order, customer, points = (field(event, k) for k in ("order_id", "customer_id", "points"))
    ids_ok = all(type(v) in (str, int) for v in (order, customer))  # not bool, not float
    if not (ids_ok and type(points) is int and points > 0):
        raise ValueError("order.completed needs order_id, customer_id and points > 0")
    return str(order), str(customer), points


def apply_batch(db, claims):
    """Apply a batch of claims in ONE transaction; returns the ack of each, in order."""
    acks = []
    db.execute("BEGIN IMMEDIATE")  # take the write lock now: no lock upgrade to deadlock on
    try:
        for c in claims:
            ack = {"token": c["token"], "outcome": "done"}
            acks.append(ack)
            try:
                order = order_of(c) if c["type"] == "order.completed" else None
            except ValueError as e:  # nothing to apply, ever: fail it for ops to see
                ack.update(outcome="fail", error=str(e))
                continue
            # 1. Claim the event. If it is already there, it was applied before: a duplicate.
            cur = db.execute(
                "INSERT INTO processed_events VALUES (?, ?, ?, 'applied', ?)"
                " ON CONFLICT (source, event_id) DO NOTHING",
                (c["source"], c["event_id"], c["type"], time.time()))
            if cur.rowcount == 0 or order is None:
                continue
            # 2. Claim the order. The same order under another event id credits nothing.
            order_id, customer, points = order
            cur = db.execute(
                "INSERT INTO loyalty_credits VALUES (?, ?, ?, ?, ?) ON CONFLICT (order_id) DO NOTHING",
                (order_id, customer, points, c["source"], c["event_id"]))
            if cur.rowcount == 0:
                db.execute("UPDATE processed_events SET outcome = 'business_duplicate'"
                           " WHERE source = ? AND event_id = ?", (c["source"], c["event_id"]))
                continue
            # 3. The effect itself.
            db.execute(
                "INSERT INTO loyalty_balances VALUES (?, ?) ON CONFLICT (customer_id)"
                " DO UPDATE SET balance = balance + excluded.balance", (customer, points))
        db.execute("COMMIT")  # the dedup rows and the effects become durable together
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return acks


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the webhook-inbox server")
    p.add_argument("--subscription", required=True, help="the pull subscription's name")
    p.add_argument("--token", required=True, help="the subscription's token")
    p.add_argument("--db", required=True, help="this consumer's SQLite file (created if missing)")
    p.add_argument("--batch", type=int, default=100, help="events per claim (1 to 1000)")
    p.add_argument("--lease-ms", type=int, default=30000, help="how long a claim is ours")
    p.add_argument("--wait-ms", type=int, default=2000, help="long poll: wait this long for work")
    args = p.parse_args()

    db = sqlite3.connect(args.db, timeout=60, isolation_level=None)  # we write BEGIN/COMMIT
    db.execute("PRAGMA busy_timeout = 60000")  # wait for the other copies, don't fail
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(SCHEMA)
    client = Client(args.url, args.subscription, args.token, timeout=30)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    print(f"consuming {args.subscription} from {args.url}", flush=True)
    backoff = 0.1
    while not stopping:
        try:
            claims = client.claim(args.batch, args.lease_ms, args.wait_ms)
            if stopping:  # claimed while asked to stop: give them back untouched
                if claims:
                    client.ack([{"token": c["token"], "outcome": "release"} for c in claims])
                break
            if claims:
                acks = apply_batch(db, claims)
                # Committed: now say so. A crash here only means a redelivery, a duplicate.
                lost = sum(not r["applied"] for r in client.ack(acks))
                if lost:  # the lease ran out first: another worker has them, and dedups them
                    print(f"{lost} acks came after their leases ran out", file=sys.stderr)
            backoff = 0.1
        except urllib.error.HTTPError as e:
            if e.code < 500:  # a wrong token or name, a bad request: retrying cannot help
                sys.exit(f"webhook-inbox refused the call: {e.code} {e.read().decode(errors='replace')}")
            print(f"webhook-inbox answered {e.code}; retrying in {backoff:.1f} s",
                  file=sys.stderr, flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
            # The server is restarting or unreachable: the leases keep our claims safe.
            print(f"webhook-inbox unreachable ({e}); retrying in {backoff:.1f} s",
                  file=sys.stderr, flush=True)
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
    db.close()


if __name__ == "__main__":
    main()
