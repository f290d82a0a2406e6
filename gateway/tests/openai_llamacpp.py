"""The official OpenAI Python client, unmodified, through the gateway to a
real llama.cpp server (gateway/tests/llamacpp.rs). The model is a tiny
random-weight one: the text is noise; the protocol is what is checked.
Configuration only from the environment (OPENAI_BASE_URL, OPENAI_API_KEY,
SSL_CERT_FILE). Exits non-zero on any mismatch.
"""
import openai
from openai_stream import read_chat_stream

client = openai.OpenAI(max_retries=0)
MODEL = "synthetic-small"  # the gateway's public name; sent up as tiny-llama
MESSAGES = [{"role": "user", "content": "Hello there"}]

chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
assert chat.object == "chat.completion", chat
assert chat.id.startswith("chatcmpl-"), chat.id
assert chat.choices[0].finish_reason == "length", chat
assert chat.usage.completion_tokens == 12, chat.usage
assert chat.usage.prompt_tokens > 0, chat.usage
assert chat.choices[0].message.content, chat

stream = client.chat.completions.create(
    model=MODEL,
    messages=MESSAGES,
    max_tokens=12,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
streamed, finish, usage = read_chat_stream(stream)
assert finish == "length", finish
assert usage is not None and usage.completion_tokens == 12, usage
assert streamed == chat.choices[0].message.content, (streamed, chat.choices[0].message.content)

done = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
assert done.object == "text_completion", done
assert done.usage.completion_tokens == 8, done.usage
assert done.choices[0].text, done

pieces = []
for chunk in client.completions.create(
    model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True
):
    for choice in chunk.choices:
        pieces.append(choice.text)
assert "".join(pieces) == done.choices[0].text, ("".join(pieces), done.choices[0].text)

try:
    client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
    raise AssertionError("an unknown model must be refused")
except openai.NotFoundError:
    pass

print("OK")
