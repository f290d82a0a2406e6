"""The official OpenAI Python client's images and videos calls, unmodified,
against the gateway's GenServe pool (issue 24).

Configuration comes only from the environment the client reads anyway:
OPENAI_BASE_URL, OPENAI_API_KEY, and SSL_CERT_FILE for the development CA.
Exits non-zero on any mismatch.
"""
import base64
import struct

import openai

client = openai.OpenAI(max_retries=0)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return struct.unpack(">II", data[16:24])


# Images: two 512x512 PNGs, base64 in the answer.
res = client.images.generate(prompt="a lighthouse at dusk", size="512x512", n=2)
assert len(res.data) == 2, res
for image in res.data:
    assert png_size(base64.b64decode(image.b64_json)) == (512, 512)
assert res.created > 0, res

# Videos: create (a multipart form, as the client sends it), poll, download.
video = client.videos.create(prompt="waves on a beach", seconds="4", size="480x832")
assert video.object == "video" and video.status in ("queued", "in_progress"), video
assert video.seconds == "4" and video.size == "480x832", video
try:
    client.videos.download_content(video.id)
    raise AssertionError("content before completion")
except openai.APIStatusError as e:
    assert e.status_code == 409, e
done = client.videos.poll(video.id, poll_interval_ms=50)
assert done.status == "completed" and done.progress == 100, done
assert done.completed_at is not None, done
content = client.videos.download_content(done.id).read()
assert png_size(content) == (32, 32), "the synthetic model's resolution"
assert b"acTL" in content, "an animated PNG"
listed = [v.id for v in client.videos.list()]
assert done.id in listed, listed
deleted = client.videos.delete(done.id)
assert deleted.deleted and deleted.id == done.id, deleted
try:
    client.videos.retrieve(done.id)
    raise AssertionError("retrieved after delete")
except openai.NotFoundError:
    pass

# Bad input: typed 400s the client raises as BadRequestError.
for kwargs, param in [
    (dict(prompt="x", size="9x9"), "size"),
    (dict(prompt="x", n=99), "n"),
    (dict(prompt="x", response_format="url"), "response_format"),
]:
    try:
        client.images.generate(**kwargs)
        raise AssertionError(f"accepted {kwargs}")
    except openai.BadRequestError as e:
        assert e.body["param"] == param, e.body
try:
    client.videos.create(prompt="x", seconds="-3")
    raise AssertionError("negative seconds accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "seconds", e.body
try:
    client.images.generate(prompt="x", model="not-a-model")
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
print("OK")
