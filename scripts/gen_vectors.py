#!/usr/bin/env python3
"""Generate tests/vectors/signatures.json: signature test vectors for every scheme.

Independent of our Rust code on purpose: standard-webhooks and stripe vectors are
signed and re-verified by the providers' own libraries, so a misreading of the spec
shared by the Rust verifier and its tests cannot hide. github/shopify/hmac-sha256
have no reference library (stdlib, anchored by GitHub's published vector). Every
vector is re-verified at its `now`; any disagreement with `valid` aborts the run.

    pip install -r scripts/requirements-vectors.txt && python3 scripts/gen_vectors.py
    python3 scripts/gen_vectors.py --check   # exit 1 if the checked-in file is stale
"""
import argparse
import base64
import collections
import hashlib
import hmac
import importlib.metadata
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock
from urllib.parse import urlencode

import standardwebhooks
import standardwebhooks.webhooks
import stripe

REGENERATE = "pip install -r scripts/requirements-vectors.txt && python3 scripts/gen_vectors.py"
OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "signatures.json"
TOLERANCE = 300  # SPEC default tolerance_seconds, applied in both directions
TS = 1_700_000_000
JSON_CT = {"Content-Type": "application/json"}
# 32-byte key: padded base64 containing '/'. 31-byte key: its '==' padding stripped
# (SPEC: "padded or not") and containing '+', so the decoder's alphabet is exercised.
SW_SECRET = "whsec_rs3uroCO1uPjq6Wgbw4k0HKSHJpNO9wcN//Tp5E6eq4="
SW_SECRET_UNPADDED = "whsec_0CesRI3wSUC7RnLRyrEMo+fI0xk6n1j+YdHsaiOwfg"
# Published vectors: Standard Webhooks spec (secret, id, ts, body, sig) and GitHub docs (secret, body, sig).
SW_PUBLISHED = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
                '{"test": 2432232314}', "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
GH_PUBLISHED = ("It's a Secret to Everybody", "Hello, World!",
                "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
UTF8_DATA = {"name": "Zoë Ångström", "city": "東京", "note": "naïve café ✓ 🚀"}

vectors: list[dict] = []


def ensure(cond, msg):
    # Not `assert`: these checks are the script's whole point and must survive `python -O`.
    if not cond:
        raise SystemExit(f"gen_vectors: {msg}")


def add(name, scheme, secret, body, headers, now, valid, source_lib):
    ensure(name not in {v["name"] for v in vectors}, f"duplicate vector name {name}")
    vectors.append({"name": name, "scheme": scheme, "secret": secret, "body": body,
                    "headers": headers, "now": now, "valid": valid, "source_lib": source_lib})


def jbody(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def tamper(body: str) -> str:
    """Change exactly one character (the last digit) so the body stays valid JSON."""
    i = max(i for i, c in enumerate(body) if c in "0123456789")
    return body[:i] + str((int(body[i]) + 1) % 10) + body[i + 1:]


def mac(key: str | bytes, msg: str) -> bytes:
    key = key.encode("utf-8") if isinstance(key, str) else key
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


# --- standard-webhooks: signed and verified by the `standardwebhooks` package ---

def sw_sign(secret: str, msg_id: str, ts: int, body: str) -> str:
    # sign() does timestamp.replace(tzinfo=utc), so a naive local-time datetime would
    # be silently shifted by the UTC offset: always pass an aware UTC one.
    return standardwebhooks.Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, tz=timezone.utc), body)


def sw_lib_accepts(v) -> bool:
    # The library reads only webhook-* names; svix-* is the same protocol renamed.
    headers = {k.lower().replace("svix-", "webhook-"): val for k, val in v["headers"].items()}
    # verify() calls datetime.now() with no way to inject a clock: pin it to `now`.
    clock = mock.MagicMock(wraps=datetime)
    clock.now.return_value = datetime.fromtimestamp(v["now"], tz=timezone.utc)
    with mock.patch.object(standardwebhooks.webhooks, "datetime", clock):
        try:
            standardwebhooks.Webhook(v["secret"]).verify(v["body"], headers)
            return True
        except standardwebhooks.WebhookVerificationError:
            return False


def sw_headers(msg_id, ts, sig, prefix="webhook"):
    return {f"{prefix}-id": msg_id, f"{prefix}-timestamp": str(ts), f"{prefix}-signature": sig, **JSON_CT}


def gen_standard_webhooks():
    def sw(name, secret, body, headers, now, ok, src="standardwebhooks"):
        add(name, "standard-webhooks", secret, body, headers, now, ok, src)

    p_secret, p_id, p_ts, p_body, p_sig = SW_PUBLISHED
    ensure(sw_sign(p_secret, p_id, p_ts, p_body) == p_sig, "standardwebhooks disagrees with the published vector")
    sw("sw_published_spec", p_secret, p_body, sw_headers(p_id, p_ts, p_sig), p_ts, True, "published")

    body = jbody({"type": "invoice.paid", "data": {"invoice": "in_1001", "amount": 4200}})
    mid = "msg_2Xa9fQk3LmN7pR4sT6vW8yZ0"
    sig = sw_sign(SW_SECRET, mid, TS, body)
    hdrs = sw_headers(mid, TS, sig)
    sw("sw_basic", SW_SECRET, body, hdrs, TS, True)
    sw("sw_svix_header_names", SW_SECRET, body, sw_headers(mid, TS, sig, "svix"), TS, True)
    sw("sw_tolerance_edge_old", SW_SECRET, body, hdrs, TS + TOLERANCE, True)
    sw("sw_tolerance_edge_new", SW_SECRET, body, hdrs, TS - TOLERANCE, True)
    sw("sw_stale_timestamp", SW_SECRET, body, hdrs, TS + TOLERANCE + 1, False)
    sw("sw_future_timestamp", SW_SECRET, body, hdrs, TS - TOLERANCE - 1, False)
    sw("sw_tampered_body", SW_SECRET, tamper(body), hdrs, TS, False)
    wrong = sw_sign(SW_SECRET_UNPADDED, mid, TS, body)
    sw("sw_wrong_secret", SW_SECRET, body, sw_headers(mid, TS, wrong), TS, False)
    # Sender-side key rotation: several signatures, only the second matches.
    sw("sw_two_signatures_second_matches", SW_SECRET, body, sw_headers(mid, TS, f"{wrong} {sig}"), TS, True)
    # The Stripe-rule mistake (key = the secret string's bytes, not base64-decoded);
    # stdlib because the library cannot be made to do it.
    raw = "v1," + base64.b64encode(mac(SW_SECRET, f"{mid}.{TS}.{body}")).decode()
    sw("sw_key_not_base64_decoded", SW_SECRET, body, sw_headers(mid, TS, raw), TS, False, "python-hmac")

    ts2, mid2 = TS + 4321, "msg_3Kd8sJ2hQ5wE1rT9yU7iO0pA"
    body2 = jbody({"type": "customer.updated", "data": UTF8_DATA})
    sig2 = sw_sign(SW_SECRET_UNPADDED, mid2, ts2, body2)
    sw("sw_utf8_body_unpadded_secret", SW_SECRET_UNPADDED, body2, sw_headers(mid2, ts2, sig2), ts2, True)


# --- stripe: signed and verified by the official `stripe` SDK ---

def stripe_v1(secret: str, ts: int, body: str) -> str:
    """The v1 hex alone, via the SDK's public test helper rather than private _compute_signature."""
    header = stripe.WebhookSignature.generate_signature_header(body, secret, timestamp=ts)
    ensure(header.startswith(f"t={ts},v1="), f"unexpected stripe header format {header}")
    return header.split(",v1=", 1)[1]


def stripe_lib_accepts(v) -> bool:
    # verify_header reads time.time() directly (and only rejects *old* timestamps).
    with mock.patch("time.time", return_value=float(v["now"])):
        try:
            return stripe.WebhookSignature.verify_header(
                v["body"], v["headers"]["Stripe-Signature"], v["secret"], tolerance=TOLERANCE)
        except stripe.SignatureVerificationError:
            return False


def gen_stripe():
    def st(name, secret, body, header, now, ok, src="stripe"):
        add(name, "stripe", secret, body, {"Stripe-Signature": header, **JSON_CT}, now, ok, src)

    # Stripe sends pretty-printed JSON; the signature covers the newlines verbatim.
    secret = "whsec_5f0d2c7e9a1b4c3d8e6f0a1b2c3d4e5f"  # key = the whole string's bytes
    body = json.dumps({"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event", "type": "payment_intent.succeeded",
                       "data": {"object": {"id": "pi_3NG8Dt2eZvKYlo2C0", "amount": 2000}}}, indent=2)
    good = f"t={TS},v1={stripe_v1(secret, TS, body)}"
    st("stripe_whsec_secret", secret, body, good, TS, True)
    st("stripe_tolerance_edge", secret, body, good, TS + TOLERANCE, True)
    st("stripe_stale_timestamp", secret, body, good, TS + TOLERANCE + 1, False)
    st("stripe_tampered_body", secret, tamper(body), good, TS, False)
    # Test-mode deliveries append a v0 entry: it must be ignored, not break parsing.
    st("stripe_ignores_v0", secret, body, f"{good},v0={stripe_v1('whsec_legacy_other', TS, body)}", TS, True)
    # The standard-webhooks mistake: keying with the base64-decoded part after whsec_.
    decoded = base64.b64decode(secret.removeprefix("whsec_"))
    bad = mac(decoded, f"{TS}.{body}").hex()
    st("stripe_key_base64_decoded", secret, body, f"t={TS},v1={bad}", TS, False, "python-hmac")

    secret2, ts2 = "stripe-endpoint-secret-2", TS + 777
    body2 = jbody({"id": "evt_1OaBcD2eZvKYlo2Cq8UtF4pL", "object": "event", "type": "customer.updated",
                   "data": {"object": UTF8_DATA}})
    sig2 = stripe_v1(secret2, ts2, body2)
    st("stripe_utf8_body", secret2, body2, f"t={ts2},v1={sig2}", ts2, True)
    # Secret rotation: the first v1 is from the old secret, only the second matches.
    old = stripe_v1("stripe-endpoint-secret-1", ts2, body2)
    st("stripe_two_v1_second_matches", secret2, body2, f"t={ts2},v1={old},v1={sig2}", ts2, True)
    st("stripe_wrong_secret", secret2, body2, f"t={ts2},v1={old}", ts2, False)


# --- github / shopify / hmac-sha256: no reference library, stdlib only ---

def hmac_lib_accepts(v) -> bool:
    """Re-parses each header format separately from signing, so formatting slips get caught."""
    h = {k.lower(): val for k, val in v["headers"].items()}
    expected = mac(v["secret"], v["body"])
    if v["scheme"] == "github":
        got = h.get("x-hub-signature-256", "")
        return got.startswith("sha256=") and hmac.compare_digest(got[7:], expected.hex())
    if v["scheme"] == "shopify":
        return hmac.compare_digest(h.get("x-shopify-hmac-sha256", ""), base64.b64encode(expected).decode())
    got = h.get("x-signature", "")
    return got != "" and hmac.compare_digest(got.removeprefix("sha256="), expected.hex())


def gen_github():
    def gh(name, secret, body, sig, ok, delivery, event="push", ctype="application/json", src="python-hmac"):
        headers = {"X-GitHub-Delivery": delivery, "X-GitHub-Event": event, **sig, "Content-Type": ctype}
        add(name, "github", secret, body, headers, TS, ok, src)

    def sig(secret, body):
        return {"X-Hub-Signature-256": "sha256=" + mac(secret, body).hex()}

    p_secret, p_body, p_sig = GH_PUBLISHED
    ensure(sig(p_secret, p_body)["X-Hub-Signature-256"] == p_sig, "stdlib disagrees with GitHub's published vector")
    gh("gh_published_docs", p_secret, p_body, sig(p_secret, p_body), True,
       "72d3162e-cc78-11e3-81ab-4c9367dc0958", "ping", "text/plain", "published")

    secret = "gh-hook-secret-8c1f"
    body = jbody({"ref": "refs/heads/main", "after": "9f2c1e7", "repository": {"id": 1296269}})
    gh("gh_push", secret, body, sig(secret, body), True, "a1b2c3d4-0000-11ee-8c99-0242ac120002")
    gh("gh_tampered_body", secret, tamper(body), sig(secret, body), False, "a1b2c3d4-0000-11ee-8c99-0242ac120003")
    gh("gh_wrong_secret", secret, body, sig("gh-hook-secret-OLD", body), False, "a1b2c3d4-0000-11ee-8c99-0242ac120004")
    # Only the legacy SHA-1 header: SPEC verifies X-Hub-Signature-256, so this must fail.
    sha1 = {"X-Hub-Signature": "sha1=" + hmac.new(secret.encode(), body.encode(), hashlib.sha1).hexdigest()}
    gh("gh_only_sha1_header", secret, body, sha1, False, "a1b2c3d4-0000-11ee-8c99-0242ac120005")
    body2 = jbody({"action": "created", "issue": {"number": 42},
                   "comment": {"body": UTF8_DATA["note"], "user": UTF8_DATA["name"]}})
    gh("gh_utf8_body", secret, body2, sig(secret, body2), True, "b7e4a9f0-1111-11ee-8c99-0242ac120002", "issue_comment")
    # Form-encoded delivery: the signature covers the raw form body; JSON is in `payload`.
    form = urlencode({"payload": jbody({"zen": "Keep it logically awesome.", "hook_id": 30})})
    gh("gh_form_urlencoded", secret, form, sig(secret, form), True, "c3d5e7f9-2222-11ee-8c99-0242ac120002",
       "ping", "application/x-www-form-urlencoded")


def gen_shopify():
    def sh(name, secret, body, ok, wid, topic="orders/create", key=None, signed_body=None):
        # key/signed_body let negative vectors carry a signature made for something else.
        b64 = base64.b64encode(mac(key or secret, signed_body or body)).decode()
        headers = {"X-Shopify-Hmac-Sha256": b64, "X-Shopify-Webhook-Id": wid, "X-Shopify-Topic": topic, **JSON_CT}
        add(name, "shopify", secret, body, headers, TS, ok, "python-hmac")

    secret = "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"
    body = jbody({"id": 820982911946154508, "email": "jon@example.com", "total_price": "199.00"})
    sh("shopify_order", secret, body, True, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043")
    sh("shopify_wrong_secret", secret, body, False, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd044", key="shpss_other")
    sh("shopify_tampered_body", secret, tamper(body), False, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd045", signed_body=body)
    body2 = jbody({"id": 632910392, "title": "Crème brûlée set", "vendor": UTF8_DATA["city"]})
    sh("shopify_utf8_body", secret, body2, True, "e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a5b", "products/update")
    # A whsec_-looking secret is still just its UTF-8 bytes for this scheme.
    sh("shopify_whsec_prefixed_secret", SW_PUBLISHED[0], body, True, "f0e1d2c3-b4a5-4968-8776-655443322110")


def gen_hmac_sha256():
    def hm(name, secret, body, sig, ok, event_id=None):
        headers = {"X-Signature": sig, **({"X-Event-Id": event_id} if event_id else {}), **JSON_CT}
        add(name, "hmac-sha256", secret, body, headers, TS, ok, "python-hmac")

    secret, wsec = "generic-shared-secret-7e2a", "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHM="
    body = jbody({"type": "order.shipped", "order": 1001, "carrier": "ups"})
    hm("hmac_prefixed_with_header_id", secret, body, "sha256=" + mac(secret, body).hex(), True, "evt_gen_0001")
    # No X-Event-Id header: the id comes from body `event_id`; bare hex signature.
    body2 = jbody({"event_id": "evt_gen_0002", "type": "order.cancelled", "order": 1002})
    hm("hmac_bare_hex_body_event_id", secret, body2, mac(secret, body2).hex(), True)
    body3 = jbody({"event_id": "evt_gen_0003", "type": "profile.renamed", "data": UTF8_DATA})
    hm("hmac_utf8_body", secret, body3, "sha256=" + mac(secret, body3).hex(), True)
    hm("hmac_whsec_prefixed_secret", wsec, body, "sha256=" + mac(wsec, body).hex(), True, "evt_gen_0004")
    hm("hmac_tampered_body", secret, tamper(body), "sha256=" + mac(secret, body).hex(), False, "evt_gen_0005")
    hm("hmac_wrong_secret", secret, body, "sha256=" + mac(secret + "-OLD", body).hex(), False, "evt_gen_0006")
    decoded = base64.b64decode(wsec.removeprefix("whsec_"))
    hm("hmac_whsec_key_base64_decoded", wsec, body, "sha256=" + mac(decoded, body).hex(), False, "evt_gen_0007")


VERIFIERS = {"standard-webhooks": sw_lib_accepts, "stripe": stripe_lib_accepts,
             "github": hmac_lib_accepts, "shopify": hmac_lib_accepts, "hmac-sha256": hmac_lib_accepts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the checked-in file differs")
    args = ap.parse_args()

    for gen in (gen_standard_webhooks, gen_stripe, gen_github, gen_shopify, gen_hmac_sha256):
        gen()
    for v in vectors:
        accepted = VERIFIERS[v["scheme"]](v)
        ensure(accepted == v["valid"], f"{v['name']}: verifier says {accepted}, vector says {v['valid']}")

    doc = {"generated_by": REGENERATE,
           "library_versions": {p: importlib.metadata.version(p) for p in ("standardwebhooks", "stripe")},
           "vectors": vectors}
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale; run: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(vectors)} vectors to {OUT}:", dict(collections.Counter(v["scheme"] for v in vectors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
