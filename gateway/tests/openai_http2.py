"""The official OpenAI Python client over HTTP/2 (httpx with http2=True)
gets the typed 401 and 404, never a transport error, repeated to catch the
race an early answer with a stream reset used to lose.

Environment: OPENAI_BASE_URL, OPENAI_API_KEY (a valid key), SSL_CERT_FILE.
Exits non-zero on any mismatch; prints OK.
"""
import os

import httpx
import openai

ca = os.environ["SSL_CERT_FILE"]
base = os.environ["OPENAI_BASE_URL"]
key = os.environ["OPENAI_API_KEY"]
http = httpx.Client(http2=True, verify=ca)

ok = openai.OpenAI(max_retries=0, http_client=http)
raw = ok.chat.completions.with_raw_response.create(
    model="synthetic-small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
)
assert raw.http_response.http_version == "HTTP/2", raw.http_response.http_version

wrong = openai.OpenAI(max_retries=0, http_client=http, api_key="sk-wrong-key-0000")
for i in range(30):
    try:
        wrong.chat.completions.create(
            model="synthetic-small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        raise SystemExit(f"attempt {i}: a wrong key was accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401, e
    try:
        ok.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        raise SystemExit(f"attempt {i}: an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e
print("OK")
