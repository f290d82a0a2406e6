"""Drives the engine's own OpenAI surface with the official OpenAI Python
client, unmodified: OPENAI_BASE_URL and OPENAI_API_KEY from the environment.
Exits non-zero on any mismatch."""
import openai

client = openai.OpenAI(max_retries=0)
MODEL = "synthetic-small"

assert [m.id for m in client.models.list()] == [MODEL]

chat = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 6 and chat.usage.prompt_tokens > 0, chat.usage
assert chat.usage.total_tokens == chat.usage.prompt_tokens + 6, chat.usage
text = chat.choices[0].message.content

stream = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=6,
    stream=True,
    stream_options={"include_usage": True},
)
streamed, finish, usage = "", None, None
for chunk in stream:
    if chunk.choices:
        streamed += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        usage = chunk.usage
assert streamed == text, (streamed, text)
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 6, usage

comp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
assert comp.object == "text_completion" and comp.usage.completion_tokens == 3, comp
for part in client.completions.create(model=MODEL, prompt="Once", max_tokens=2, stream=True):
    assert part.object == "text_completion", part

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body

try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=2)
    raise SystemExit("expected BadRequestError")
except openai.BadRequestError as e:
    assert e.body["param"] == "n" and e.body["code"] == "unsupported_parameter", e.body

print("OK")
