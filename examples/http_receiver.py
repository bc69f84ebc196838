"""A webhook-inbox http subscription receiver that applies each event exactly once.

webhook-inbox delivers at least once: a timeout, a crash or a lost answer means the same event
comes again. This receiver makes the *effect* happen once anyway, and shows how:

  * Dedup on `webhook-id` (stable across attempts) and on the business key (`order_id`, which a
    sender may repeat under a new event id), both in ONE SQLite transaction with the effect.
  * The check and the act are one statement: `INSERT ... ON CONFLICT DO NOTHING`, then look at
    the row count. No "SELECT, then INSERT if absent" in Python, which two concurrent calls race.
  * A duplicate is a success (2xx), or the sender would retry it forever.

Run it (standardwebhooks is the only dependency: `pip install standardwebhooks==1.3.0`):

    python3 examples/http_receiver.py --db receiver.db --secret whsec_... --port 8080

and subscribe http://127.0.0.1:8080/hooks. An `order.completed` event whose JSON has
`order_id`, `customer_id` and `points` (at the top level or under `data`) credits the points
to the customer's balance. Answers: 204 applied, 200 "duplicate", 401 bad signature, 400 an
order.completed it cannot read (nothing stored), 500 a database error (nothing stored).

For tests (no signature needed): `POST /_control {"mode": "ok"|"500"|"hang"|"reset"|"429"|"410",
"retry_after": "2", "count": N}` makes the next N hook calls (all, without count) fail that way
without applying anything; `"late"` applies the event, then never answers (the answer is lost,
so the event comes again: a duplicate). `GET /_stats` returns the counters, balances and
credited orders.
"""

import argparse, base64, contextlib, json, os, signal, socket, sqlite3, struct, threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed_events (
    webhook_id TEXT PRIMARY KEY, source TEXT, event_id TEXT, event_type TEXT,
    received_at TEXT NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS loyalty_credits (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, points INTEGER NOT NULL,
    webhook_id TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS loyalty_balances (
    customer_id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
"""
MODES = {"ok", "500", "hang", "reset", "429", "410", "late"}


@contextlib.contextmanager
def connect(path):
    # One short-lived connection per request; isolation_level=None: we write BEGIN/COMMIT.
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        db.execute("PRAGMA busy_timeout = 30000")  # wait for the other writers, don't fail
        yield db
    finally:
        db.close()


def field(body, name):  # a field at the top level of the event, or else inside its `data`
    if name in body:
        return body[name]
    data = body.get("data")
    return data.get(name) if isinstance(data, dict) else None


def apply_event(db, wid, headers, body):
    """Process one verified event in one transaction. Returns the counter to bump."""
    etype = headers.get("webhook-inbox-event-type", "")
    db.execute("BEGIN IMMEDIATE")  # take the write lock now: no lock upgrade to deadlock on
    try:
        # 1. Claim the webhook-id. If it is already there, this event was applied before.
        cur = db.execute(
            "INSERT INTO processed_events VALUES (?, ?, ?, ?, ?, 'applied')"
            " ON CONFLICT (webhook_id) DO NOTHING",
            (wid, headers.get("webhook-inbox-source"), headers.get("webhook-inbox-event-id"),
             etype, datetime.now(timezone.utc).isoformat()))
        if cur.rowcount == 0:
            db.execute("ROLLBACK")
            return "duplicates"
        outcome = "applied"
        if etype == "order.completed":
            event = json.loads(body)
            if not isinstance(event, dict):
                raise ValueError("order.completed body is not a JSON object")
            order, customer, points = (field(event, k) for k in ("order_id", "customer_id",
                                                                 "points"))
            ids_ok = all(type(v) in (str, int) for v in (order, customer))  # not bool, not float
            if not (ids_ok and type(points) is int and points > 0):
                raise ValueError("order.completed needs order_id, customer_id and points > 0")
            # 2. Claim the order. The same order under another webhook-id credits nothing.
            cur = db.execute(
                "INSERT INTO loyalty_credits VALUES (?, ?, ?, ?) ON CONFLICT (order_id) DO NOTHING",
                (str(order), str(customer), points, wid))
            if cur.rowcount == 0:
                outcome = "business_duplicates"
                db.execute("UPDATE processed_events SET outcome = 'business_duplicate'"
                           " WHERE webhook_id = ?", (wid,))
            else:  # 3. The effect itself.
                db.execute(
                    "INSERT INTO loyalty_balances VALUES (?, ?) ON CONFLICT (customer_id)"
                    " DO UPDATE SET balance = balance + excluded.balance", (str(customer), points))
        db.execute("COMMIT")  # the claim and the effect become durable together, or neither
        return outcome
    except BaseException:
        db.execute("ROLLBACK")
        raise


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as webhook-inbox's client pools connections
    server: "Receiver"

    def reply(self, status, body=b"", headers=()):
        if isinstance(body, (dict, str)):
            body = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))  # exactly that many

    def do_GET(self):
        if self.path != "/_stats":
            return self.reply(404, "not found\n")
        srv = self.server
        with srv.lock:
            stats = dict(srv.stats, by_webhook_id_calls=dict(srv.by_id))
        with connect(srv.db_path) as db:
            stats["balances"] = dict(db.execute("SELECT * FROM loyalty_balances"))
            credited = db.execute("SELECT count(*) FROM loyalty_credits").fetchone()[0]
        stats["credited_orders"] = credited
        self.reply(200, stats, [("Content-Type", "application/json")])

    def do_POST(self):
        body = self.read_body()
        if self.path == "/_control":
            return self.control(body)
        srv, headers = self.server, {k.lower(): v for k, v in self.headers.items()}
        wid = headers.get("webhook-id")
        with srv.lock:
            srv.stats["calls"] += 1
            if wid:
                srv.by_id[wid] = srv.by_id.get(wid, 0) + 1
            mode, retry_after = srv.mode, srv.retry_after
            if mode != "ok":
                srv.stats["misbehaved"] += 1
                if srv.remaining is not None:  # misbehave for the next N calls only
                    srv.remaining -= 1
                    if srv.remaining <= 0:
                        srv.mode, srv.remaining = "ok", None
        if mode not in ("ok", "late"):
            return self.misbehave(mode, retry_after)
        try:  # verify the raw bytes, as received; json_parse=False: the body need not be JSON
            srv.webhook.verify(body, headers, json_parse=False)
        except WebhookVerificationError as e:
            srv.count("rejected_signature")
            return self.reply(401, f"bad signature: {e}\n")
        srv.count("verified")
        try:
            with connect(srv.db_path) as db:
                outcome = apply_event(db, wid, headers, body)
        except ValueError as e:  # includes bad JSON: the event can't be processed; not stored
            srv.count("invalid")
            return self.reply(400, f"invalid event: {e}\n")
        except sqlite3.Error as e:  # nothing was committed: let the sender try again later
            return self.reply(500, f"database error: {e}\n")
        srv.count(outcome)
        if mode == "late":  # applied and committed, but the answer never reaches the sender
            self.close_connection = True
            srv.stopping.wait(60)
            return
        if outcome == "duplicates":
            return self.reply(200, "duplicate\n")  # a duplicate is a success
        self.reply(204)

    def misbehave(self, mode, retry_after):
        """Fail the way a real endpoint does, without applying anything."""
        if mode in ("500", "429"):
            extra = [("Retry-After", retry_after or "1")] if mode == "429" or retry_after else []
            return self.reply(int(mode), f"misbehaving: {mode}\n", extra)
        if mode == "410":
            return self.reply(410, "gone\n")
        self.close_connection = True
        if mode == "hang":  # no answer until the client gives up (or we shut down)
            self.server.stopping.wait(60)
            return
        # reset: linger 0 makes close() send a TCP RST; detach so nothing else sends a FIN first.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        os.close(self.connection.detach())

    def control(self, body):
        """POST /_control {"mode": "ok|500|hang|reset|429|410", "retry_after": "2", "count": N}"""
        try:
            req = json.loads(body)
            mode, count = req["mode"], req.get("count")
            if mode not in MODES or not (count is None or (type(count) is int and count > 0)):
                raise ValueError(mode)
        except (ValueError, KeyError, TypeError) as e:
            return self.reply(400, f"bad control request: {e}\n")
        ra = req.get("retry_after")
        srv = self.server
        with srv.lock:
            srv.mode, srv.remaining = mode, count
            srv.retry_after = None if ra is None else str(ra)
        self.reply(200, {"mode": mode, "retry_after": srv.retry_after, "count": count},
                   [("Content-Type", "application/json")])


class Receiver(ThreadingHTTPServer):
    daemon_threads = True  # a hung handler must not keep the process alive
    request_queue_size = 128  # up to 64 calls at once, with room to spare

    def __init__(self, addr, db_path, secret, mode):
        super().__init__(addr, Handler)
        self.db_path, self.webhook = db_path, Webhook(secret)  # takes "whsec_<base64>"
        self.lock, self.stopping = threading.Lock(), threading.Event()
        self.mode, self.retry_after, self.remaining, self.by_id = mode, None, None, {}
        self.stats = dict.fromkeys(["calls", "verified", "rejected_signature", "applied",
                                    "duplicates", "business_duplicates", "invalid",
                                    "misbehaved"], 0)

    def count(self, key):
        with self.lock:
            self.stats[key] += 1
            if key == "business_duplicates":  # processed too, just with nothing to credit
                self.stats["applied"] += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 (default): pick a free port")
    p.add_argument("--db", required=True, help="SQLite file (created if missing)")
    p.add_argument("--secret", default=os.environ.get("WEBHOOK_SECRET"),
                   help="whsec_... (default: $WEBHOOK_SECRET)")
    p.add_argument("--port-file", help="write the bound port here (atomically)")
    p.add_argument("--mode", choices=sorted(MODES), default="ok", help="initial misbehaviour")
    args = p.parse_args()
    if not args.secret:
        p.error("--secret or WEBHOOK_SECRET is required")
    try:  # standardwebhooks silently skips non-base64 characters in a secret: check it first
        b64 = args.secret.removeprefix("whsec_")
        if not base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True):
            raise ValueError("empty")
    except ValueError as e:  # binascii.Error is a ValueError
        p.error(f"the secret must be whsec_ followed by base64: {e}")

    with connect(args.db) as db:
        db.execute("PRAGMA journal_mode = WAL")  # readers don't block the writer; persistent
        db.executescript(SCHEMA)
    server = Receiver((args.host, args.port), args.db, args.secret, args.mode)
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(args.port_file + ".tmp", args.port_file)  # readers never see half a file
    print(f"listening on {args.host}:{port}", flush=True)

    def stop(signum, frame):
        server.stopping.set()  # wake hung handlers
        threading.Thread(target=server.shutdown).start()  # shutdown() waits for serve_forever

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    server.server_close()


if __name__ == "__main__":
    main()
