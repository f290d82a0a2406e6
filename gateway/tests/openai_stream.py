"""Shared by the OpenAI-client test scripts: a streamed chat completion
read the way an application reads it."""


def read_chat_stream(stream):
    """The text, finish reason and usage of a streamed chat completion."""
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    return "".join(parts), finish, usage
