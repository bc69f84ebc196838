"""A RabbitMQ consumer of a webhook-inbox `amqp` subscription that applies each event once.

webhook-inbox publishes each event with `message_id` = its `webhook-id`, persistent, with
publisher confirms and `mandatory`. RabbitMQ keeps no duplicate window: an event whose confirm
was lost (a node killed, a broker restarted) is published again, and the queue holds it twice.
RabbitMQ also redelivers what a consumer took and did not ack. So this consumer makes its
*effect* happen once, as examples/pull_consumer.py does:

  * Dedup on `message_id` and on the business key (`order_id`, which a sender may repeat under
    a new event id), both in ONE SQLite transaction with the effect.
  * The check and the act are one statement: `INSERT ... ON CONFLICT DO NOTHING`, then look at
    the row count.
  * Commit first, then ack. A crash between the two only means the message comes again, and
    the dedup row answers it. A duplicate is acked too.

Needs `pip install pika`. Run it (with --exchange, the queue is declared durable and bound to
the exchange for --binding, `#` by default; without it, the queue must exist):

    python3 examples/amqp_consumer.py --url amqp://guest:guest@127.0.0.1:5672/%2f \
        --queue loyalty --exchange webhooks --binding 'webhooks.#' --db consumer.db

An `order.completed` event whose JSON has `order_id`, `customer_id` and `points` (at the top
level or under `data`) credits the points; every other event is only recorded. A message it
cannot read is rejected without requeue (a dead-letter exchange on the queue keeps it for ops)
and logged. It stops on SIGTERM or SIGINT; messages taken and not acked come again.
"""

import argparse, json, signal, sqlite3, sys, time

import pika

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


def header(properties, name):
    value = (properties.headers or {}).get(name)
    return value.decode() if isinstance(value, bytes) else value


def apply(db, properties, body):
    """Apply one message in ONE transaction; returns 'applied', 'duplicate' or an error."""
    msg_id = properties.message_id
    if not msg_id:
        return "error: no message_id (not published by webhook-inbox)"
    event_type = header(properties, "webhook-inbox-event-type") or ""
    try:
        order = order_of(body) if event_type == "order.completed" else None
    except ValueError as e:
        return f"error: {e}"
    db.execute("BEGIN IMMEDIATE")
    try:
        cur = db.execute(
            "INSERT INTO processed_messages VALUES (?, ?, ?, ?, 'applied', ?)"
            " ON CONFLICT (msg_id) DO NOTHING",
            (msg_id, header(properties, "webhook-inbox-source"),
             header(properties, "webhook-inbox-event-id"), event_type, time.time()))
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


def run(args):
    db = sqlite3.connect(args.db, timeout=60, isolation_level=None)  # we write BEGIN/COMMIT
    db.execute("PRAGMA journal_mode = WAL")
    db.executescript(SCHEMA)
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    if args.exchange:
        channel.queue_declare(args.queue, durable=True)
        channel.queue_bind(args.queue, args.exchange, routing_key=args.binding)
    channel.basic_qos(prefetch_count=args.prefetch)
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    print(f"consuming {args.queue}", flush=True)
    # The generator yields (None, None, None) after `wait` seconds without a message, so that
    # a stop is seen on an idle queue too.
    for method, properties, body in channel.consume(args.queue, inactivity_timeout=args.wait):
        if stopping:
            break
        if method is None:
            continue
        outcome = apply(db, properties, body)
        if outcome.startswith("error"):
            print(f"{outcome}: rejected", file=sys.stderr, flush=True)
            channel.basic_reject(method.delivery_tag, requeue=False)
        else:
            channel.basic_ack(method.delivery_tag)  # committed: a lost ack is a duplicate next time
    channel.cancel()  # what was taken and not acked goes back to the queue
    connection.close()
    db.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/%2f", help="the broker")
    p.add_argument("--queue", required=True, help="the queue to consume")
    p.add_argument("--exchange", help="declare the queue (durable) and bind it to this exchange")
    p.add_argument("--binding", default="#", help="the binding key, with --exchange")
    p.add_argument("--db", required=True, help="this consumer's SQLite file (created if missing)")
    p.add_argument("--prefetch", type=int, default=100, help="messages taken ahead of acks")
    p.add_argument("--wait", type=float, default=1.0, help="seconds idle before a stop is seen")
    run(p.parse_args())


if __name__ == "__main__":
    main()
