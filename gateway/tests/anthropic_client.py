"""Drives the gateway's Messages API with the official Anthropic Python SDK,
unmodified.

Configuration comes only from the environment the SDK reads anyway
(ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY; SSL_CERT_FILE for the development
CA), plus HELD_KEY: a tenant whose tier allows one request at a time
(the test holds it busy with a slow stream). Exits non-zero on any mismatch.
"""
import os
import threading
import time

import anthropic

client = anthropic.Anthropic(max_retries=0)
MODEL = "synthetic-small"

msg = client.messages.create(
    model=MODEL,
    max_tokens=6,
    system="be brief",
    messages=[{"role": "user", "content": "Hello"}],
    temperature=0.0,
    top_k=40,
    metadata={"user_id": "user-1"},
)
assert msg.type == "message" and msg.role == "assistant", msg
assert msg.stop_reason == "max_tokens", msg
assert msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0, msg.usage
assert msg.id.startswith("msg_"), msg.id
text = msg.content[0].text
assert text, msg

# The stream: text deltas, then the final message with usage.
with client.messages.stream(
    model=MODEL,
    max_tokens=6,
    system="be brief",
    messages=[{"role": "user", "content": "Hello"}],
    temperature=0.0,
) as stream:
    deltas = list(stream.text_stream)
    final = stream.get_final_message()
assert "".join(deltas) == text, (deltas, text)
assert final.content[0].text == text, final
assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6, final

# Raw events: Anthropic's sequence.
events = client.messages.create(
    model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Hi"}], stream=True
)
kinds = [e.type for e in events]
assert kinds[:3] == ["message_start", "content_block_start", "content_block_delta"] or kinds[:2] == [
    "message_start",
    "content_block_start",
], kinds
assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
assert kinds.count("content_block_delta") == 3, kinds

count = client.messages.count_tokens(
    model=MODEL, system="be brief", messages=[{"role": "user", "content": "Hello"}]
)
assert count.input_tokens == msg.usage.input_tokens, (count, msg.usage)

# Typed exceptions.
try:
    client.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected NotFoundError")
except anthropic.NotFoundError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body
try:
    anthropic.Anthropic(api_key="sk-wrong", max_retries=0).messages.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    raise SystemExit("expected AuthenticationError")
except anthropic.AuthenticationError as e:
    assert e.body["error"]["type"] == "authentication_error", e.body
try:
    client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}], temperature=1.5)
    raise SystemExit("expected BadRequestError")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    assert "temperature" in e.body["error"]["message"], e.body

# A tenant at its concurrency limit: 429 rate_limit_error with the
# gateway's Retry-After, which the SDK's own retry honours.
held = anthropic.Anthropic(api_key=os.environ["HELD_KEY"], max_retries=0)
busy = threading.Event()


def hold():
    with held.messages.stream(
        model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "slow"}]
    ) as s:
        for _ in s.text_stream:
            busy.set()


holder = threading.Thread(target=hold)
holder.start()
assert busy.wait(10), "the holding stream never started"
try:
    held.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected RateLimitError")
except anthropic.RateLimitError as e:
    assert e.body["error"]["type"] == "rate_limit_error", e.body
    retry_after = int(e.response.headers["retry-after"])
    assert retry_after >= 1, e.response.headers
t0 = time.monotonic()
ok = held.with_options(max_retries=3).messages.create(
    model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "x"}]
)
waited = time.monotonic() - t0
holder.join()
assert ok.usage.output_tokens == 3, ok
assert waited >= retry_after * 0.9, f"the SDK retried after {waited:.2f} s, before Retry-After {retry_after} s"

print("OK")
