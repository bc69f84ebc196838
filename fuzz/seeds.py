#!/usr/bin/env python3
"""Writes the checked-in seed corpora (fuzz/corpus/<target>/) from real examples: the
signature vectors of tests/vectors/signatures.json, bodies, the README's config, replay lines
and cursors. Run from anywhere; it replaces what it writes and nothing else."""

import base64
import json
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGETS = {"standard-webhooks": "signature_standard", "stripe": "signature_stripe",
           "github": "signature_github", "shopify": "signature_shopify",
           "hmac-sha256": "signature_hmac"}


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


vectors = json.load(open(os.path.join(ROOT, "tests", "vectors", "signatures.json")))["vectors"]
bodies = set()
for v in vectors:
    head = "".join(f"{k}: {val}\n" for k, val in v["headers"].items() if k != "Content-Type")
    write(TARGETS[v["scheme"]], v["name"], head + "\n" + v["body"])
    if v["headers"].get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
        write("github_form", v["name"], v["body"])
    elif v["body"] not in bodies:
        write("peek", v["name"], v["body"])
    bodies.add(v["body"])

for name, body in {
    "numbers": '{"id": 12, "event_id": 3.5e2, "type": 7}',
    "repeated_key": '{"id": "a", "id": "b", "type": "x.y"}',
    "nested": '{"data": {"id": "inner"}, "type": null}',
    "array": "[1, 2]",
    "string": '"text"',
    "escapes": '{"id": "\\u00e9\\n", "type": "\\ud83d\\ude00"}',
}.items():
    write("peek", name, body)
write("github_form", "two_fields", "x=1&payload=%7B%22id%22%3A1%2C%22type%22%3A%22push%22%7D")
write("github_form", "no_payload", "a=b&c=")
write("github_form", "payload_not_object", "payload=%5B1%5D")

lines = [
    {"source": "shop", "event_id": "msg_1", "type": "order.completed",
     "body": '{"type":"order.completed","data":{"order_id":"o-1"}}'},
    {"source": "shop", "event_id": "msg_2", "type": "x",
     "body_base64": base64.b64encode(b"\xff\x00binary").decode()},
    {"source": "github", "event_id": "d-1", "type": "push",
     "body": "payload=%7B%7D", "content_type": "application/x-www-form-urlencoded"},
]
write("replay_line", "export", "\n".join(json.dumps(l) for l in lines) + "\n\n")
write("replay_line", "both_bodies", json.dumps({"source": "s", "event_id": "e", "body": "a",
                                                "body_base64": "YQ=="}))

readme = open(os.path.join(ROOT, "README.md")).read()
example = re.search(r"```toml\n(listen = .*?)```", readme, re.S).group(1)
write("config", "readme", example + "\0CONSUMERS__WORKERS=0\nADMIN_TOKEN=12345\n")
write("config", "minimal", 'database_url = "sqlite://x.db"\n[[sources]]\nname = "a"\n'
      'scheme = "github"\nsecrets = ["s"]\n\0RETENTION__COMPLETED_DAYS=7\nLOG_FORMAT=json\n')
write("config", "bad_env", "\0SOURCES=1\nCONSUMERS__=2\nLISTEN=[1,2]\n")

for seq in [0, 1, 123456, 2**63 - 1, -1]:
    write("cursor", f"v1_{seq}", base64.urlsafe_b64encode(f"v1:{seq}".encode()).rstrip(b"="))
write("cursor", "raw_seq", (987654321).to_bytes(8, "little", signed=True))
write("cursor", "other_tag", base64.urlsafe_b64encode(b"purge1:5").rstrip(b"="))
