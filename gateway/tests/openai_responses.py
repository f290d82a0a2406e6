"""Drives the gateway's Responses API with the official OpenAI Python
client, unmodified (OPENAI_BASE_URL, OPENAI_API_KEY, SSL_CERT_FILE), plus
OTHER_KEY: another tenant's key. Exits non-zero on any mismatch.
"""
import os

import openai

client = openai.OpenAI(max_retries=0)
MODEL = "synthetic-small"

# Short: cut at max_output_tokens.
cut = client.responses.create(model=MODEL, input="Hello", max_output_tokens=5, store=False)
assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", cut
assert cut.usage.output_tokens == 5, cut.usage

# A whole answer (the model ends it), stored.
first = client.responses.create(model=MODEL, input="Tell me a story", instructions="be brief")
assert first.object == "response" and first.status == "completed", first
assert first.output_text, first
assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens, first.usage
assert first.instructions == "be brief", first

# Retrieval; another tenant cannot see it.
again = client.responses.retrieve(first.id)
assert again.output_text == first.output_text, (again, first)
other = openai.OpenAI(api_key=os.environ["OTHER_KEY"], max_retries=0)
try:
    other.responses.retrieve(first.id)
    raise SystemExit("expected NotFoundError for another tenant")
except openai.NotFoundError as e:
    assert e.body["code"] == "response_not_found", e.body
try:
    other.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    raise SystemExit("expected NotFoundError chaining another tenant's response")
except openai.NotFoundError:
    pass

# Chaining: the stored conversation is the new prompt's prefix.
second = client.responses.create(
    model=MODEL, input="And then?", previous_response_id=first.id, instructions="be brief"
)
assert second.previous_response_id == first.id, second
assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, (
    second.usage,
    first.usage,
)

# The stream: the documented events, the final response.
with client.responses.stream(model=MODEL, input="Tell me a story", instructions="be brief") as stream:
    kinds = []
    deltas = []
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = stream.get_final_response()
assert kinds[:4] == [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
], kinds
assert kinds[-4:] == [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
], kinds
assert "".join(deltas) == final.output_text == first.output_text, (deltas, final.output_text)
assert client.responses.retrieve(final.id).output_text == final.output_text

deleted = client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
    raise SystemExit("expected NotFoundError after delete")
except openai.NotFoundError:
    pass

try:
    client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    raise SystemExit("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "tools", e.body

print("OK")
