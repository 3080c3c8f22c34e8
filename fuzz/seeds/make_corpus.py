#!/usr/bin/env python3
"""Writes fuzz/corpus/<target>/ seeds from the project's fixtures (run from fuzz/).

Webhook seeds are `mode ++ headers ++ 0x00 ++ body` (see src/lib.rs): every fixture body signed
(mode 1), and every recorded signature vector with its headers as sent (mode 0).
"""
import glob, hashlib, json, os, urllib.parse

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "fuzz", "corpus")


def write(target, data):
    folder = os.path.join(OUT, target)
    os.makedirs(folder, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def fixtures(channel, pattern):
    return sorted(glob.glob(os.path.join(ROOT, "channels", channel, "tests", "fixtures", pattern)))


def vector(target, mode_byte, meta_path, body_path, names):
    meta = json.load(open(meta_path))
    headers = {k.lower(): v for k, v in meta["headers"].items()}
    fields = b"\x01".join(headers[n].encode() for n in names)
    write(target, bytes([mode_byte]) + fields + b"\x00" + read(body_path))


# Telegram: every update, with the right secret.
for path in fixtures("telegram", "tg_*.json"):
    write("webhook_telegram", b"\x01\x00" + read(path))
    write("webhook_telegram", b"\x00hook-secret_1\x00" + read(path))

# Slack: events, commands (a form), interactions (a form with a `payload`).
for path in fixtures("slack", "*.json"):
    if path.endswith(".meta.json"):
        continue
    body = read(path)
    if b"block_actions" in body:
        form = urllib.parse.urlencode({"payload": json.dumps(json.loads(body), separators=(",", ":"))})
        write("webhook_slack", bytes([1 | 2 << 2]) + b"\x00" + form.encode())
    else:
        write("webhook_slack", b"\x01\x00" + body)
for path in fixtures("slack", "*.form"):
    write("webhook_slack", bytes([1 | 1 << 2]) + b"\x00" + read(path))
for meta in fixtures("slack", "*.meta.json"):
    route = 1 if ".form." in meta else 0
    vector("webhook_slack", route << 2, meta, meta.replace(".meta.json", ".body"),
           ["x-slack-request-timestamp", "x-slack-signature"])

# Discord: interactions, signed; the recorded vectors as sent.
for path in fixtures("discord", "*.json"):
    if not path.endswith(".meta.json"):
        write("webhook_discord", b"\x01\x00" + read(path))
for meta in fixtures("discord", "*.meta.json"):
    vector("webhook_discord", 0, meta, meta.replace(".meta.json", ".body"),
           ["x-signature-timestamp", "x-signature-ed25519"])

# Feishu: plaintext events sealed and signed (mode 1, encrypted channel) and plain (variant 1);
# the encrypted vectors as sent.
for path in fixtures("feishu", "*.json"):
    if ".encrypted" in path or path.endswith(".meta.json"):
        continue
    write("webhook_feishu", b"\x01\x00" + read(path))
    write("webhook_feishu", bytes([1 | 1 << 2]) + b"\x00" + read(path))
for meta in fixtures("feishu", "*.encrypted.meta.json"):
    vector("webhook_feishu", 0, meta, meta.replace(".meta.json", ".json"),
           ["x-lark-request-timestamp", "x-lark-request-nonce", "x-lark-signature"])

# Renderers: the Markdown samples below and the project's own docs, at a few limits.
markdown = [read(p) for p in sorted(glob.glob(os.path.join(ROOT, "fuzz", "seeds", "*.md")))]
for doc in ["README.md", "docs/architecture.md"]:
    markdown.append(read(os.path.join(ROOT, doc))[:6000])
for target in ["render_telegram", "render_slack", "render_discord", "render_feishu"]:
    for i, md in enumerate(markdown):
        for limit in [0, 40, 200]:
            write(target, bytes([(limit + i) % 256]) + md)

# Config: the shipped configs, and the e2e tests' config files.
for path in [os.path.join(ROOT, "config", "antler.toml"), os.path.join(ROOT, "config", "antler.example.toml")]:
    write("config", read(path))
for path in sorted(glob.glob(os.path.join(ROOT, "fuzz", "seeds", "*.toml"))):
    write("config", read(path))
for path in sorted(glob.glob(os.path.join(ROOT, "fuzz", "seeds", "*.env"))):
    write("config", read(path))

# Streams: the samples below, cut in a few ways.
for path in sorted(glob.glob(os.path.join(ROOT, "fuzz", "seeds", "*.sse"))):
    for cut in [0, 3, 255]:
        write("sse", bytes([cut]) + read(path))
        write("model_stream", bytes([cut]) + read(path))
for path in sorted(glob.glob(os.path.join(ROOT, "fuzz", "seeds", "*.completion.json"))):
    write("model_stream", b"\x00" + read(path))
