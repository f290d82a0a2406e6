"""Drives the gateway with the official OpenAI Python client, unmodified.

Configuration comes only from the environment the client reads anyway:
OPENAI_BASE_URL, OPENAI_API_KEY, and SSL_CERT_FILE for the development CA.
Exits non-zero on any mismatch.
"""
import openai
from openai_stream import read_chat_stream

client = openai.OpenAI(max_retries=0)
MODEL = "synthetic-small"

models = [m.id for m in client.models.list()]
assert MODEL in models, models
# The images and videos APIs' models are listed too, and each is found.
assert "gpt-image-1" in models and "sora-2" in models, models
assert client.models.retrieve("sora-2").id == "sora-2"

chat = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 6, chat.usage
text = chat.choices[0].message.content

stream = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=6,
    stream=True,
    stream_options={"include_usage": True},
)
streamed, finish, usage = read_chat_stream(stream)
assert streamed == text, (streamed, text)
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 6, usage

comp = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
assert comp.usage.completion_tokens == 3, comp

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body

bad = openai.OpenAI(api_key="sk-wrong", max_retries=0)
try:
    bad.models.list()
    raise SystemExit("expected AuthenticationError")
except openai.AuthenticationError:
    pass

print("OK")
