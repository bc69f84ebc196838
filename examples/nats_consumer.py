"""A JetStream consumer of a webhook-inbox `nats` subscription that applies each event once.

webhook-inbox publishes each event with `Nats-Msg-Id` = its `webhook-id`, and the stream's
duplicate window drops a re-publish within it. JetStream still delivers at least once to you
(an ack lost, a consumer restarted after its commit), so this consumer makes its *effect*
happen once anyway, as examples/pull_consumer.py does:

  * Dedup on `Nats-Msg-Id` and on the business key (`order_id`, which a sender may repeat under
    a new event id), both in ONE SQLite transaction with the effect.
  * The check and the act are one statement: `INSERT ... ON CONFLICT DO NOTHING`, then look at
    the row count.
  * Commit first, then ack. A crash between the two only means the message comes again, and
    the dedup row answers it. A duplicate is acked too.

Needs `pip install nats-py`. Run it (a durable pull consumer, created if missing):

    python3 examples/nats_consumer.py --url nats://127.0.0.1:4222 --stream WEBHOOKS \
        --subject 'webhooks.>' --durable loyalty --db consumer.db

An `order.completed` event whose JSON has `order_id`, `customer_id` and `points` (at the top
level or under `data`) credits the points; every other event is only recorded. A message it
cannot read is terminated (`term`: JetStream does not redeliver it) and logged for ops. It stops
on SIGTERM or SIGINT; messages fetched and not acked come again after the consumer's ack wait.
"""

import argparse, asyncio, json, signal, sqlite3, sys, time

import nats

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_messages (
    msg_id TEXT PRIMARY KEY, source TEXT, event_id TEXT, event_type TEXT,
    outcome TEXT NOT NULL, processed_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS loyalty_credits (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, points INTEGER NOT NULL,
    msg_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS loyalty_balances (
    customer_id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
"""


def field(event, name):  # a field at the top level of the event, or else inside its `data`
    if name in event:
        return event[name]
    data = event.get("data")
    return data.get(name) if isinstance(data, dict) else None


def order_of(payload):
    """(order_id, customer_id, points) of an order.completed body, or ValueError."""
    try:
        event = json.loads(payload)
    except ValueError:
        raise ValueError("order.completed body is not JSON")
    if not isinstance(event, dict):
        raise ValueError("order.completed body is not a JSON object")
    order, customer, points = (field(event, k) for k in ("order_id", "customer_id", "points"))
    ids_ok = all(type(v) in (str, int) for v in (order, customer))  # not bool, not float
    if not (ids_ok and type(points) is int and points > 0):
        raise ValueError("order.completed needs order_id, customer_id and points > 0")
    return str(order), str(customer), points


def apply(db, msg):
    """Apply one message in ONE transaction; returns 'applied', 'duplicate' or an error."""
    headers = msg.headers or {}
    msg_id = headers.get("Nats-Msg-Id")
    if not msg_id:
        return "error: no Nats-Msg-Id header (not published by webhook-inbox)"
    event_type = headers.get("webhook-inbox-event-type", "")
    try:
        order = order_of(msg.data) if event_type == "order.completed" else None
    except ValueError as e:
        return f"error: {e}"
    db.execute("BEGIN IMMEDIATE")
    try:
        cur = db.execute(
            "INSERT INTO processed_messages VALUES (?, ?, ?, ?, 'applied', ?)"
            " ON CONFLICT (msg_id) DO NOTHING",
            (msg_id, headers.get("webhook-inbox-source"), headers.get("webhook-inbox-event-id"),
             event_type, time.time()))
        if cur.rowcount == 0:
            db.execute("COMMIT")
            return "duplicate"
        if order is not None:
            order_id, customer, points = order
            cur = db.execute(
                "INSERT INTO loyalty_credits VALUES (?, ?, ?, ?) ON CONFLICT (order_id) DO NOTHING",
                (order_id, customer, points, msg_id))
            if cur.rowcount == 0:
                db.execute("UPDATE processed_messages SET outcome = 'business_duplicate'"
                           " WHERE msg_id = ?", (msg_id,))
            else:
                db.execute(
                    "INSERT INTO loyalty_balances VALUES (?, ?) ON CONFLICT (customer_id)"
                    " DO UPDATE SET balance = balance + excluded.balance", (customer, points))
        db.execute("COMMIT")  # the dedup row and the effect become durable together
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return "applied"


async def run(args):
    db = sqlite3.connect(args.db, timeout=60, isolation_level=None)  # we write BEGIN/COMMIT
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(SCHEMA)
    nc = await nats.connect(args.url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(args.subject, durable=args.durable, stream=args.stream)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    print(f"consuming {args.subject} of {args.stream} as {args.durable}", flush=True)
    while not stopping.is_set():
        try:
            messages = await sub.fetch(args.batch, timeout=args.wait)
        except asyncio.TimeoutError:
            # Nothing within the wait. nats-py raises its own TimeoutError (a subclass) or,
            # from a fetch that got no message at all, asyncio's: either is an idle stream.
            continue
        for msg in messages:
            outcome = apply(db, msg)
            if outcome.startswith("error"):
                print(f"{outcome}: terminated", file=sys.stderr, flush=True)
                await msg.term()
            else:
                await msg.ack()  # committed: now say so; a lost ack is a duplicate next time
    await nc.close()
    db.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="nats://127.0.0.1:4222", help="the broker")
    p.add_argument("--stream", required=True, help="the stream webhook-inbox publishes to")
    p.add_argument("--subject", required=True, help="the subjects to consume, e.g. webhooks.>")
    p.add_argument("--durable", required=True, help="the durable consumer's name")
    p.add_argument("--db", required=True, help="this consumer's SQLite file (created if missing)")
    p.add_argument("--batch", type=int, default=100, help="messages per fetch")
    p.add_argument("--wait", type=float, default=2.0, help="seconds a fetch waits for messages")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
