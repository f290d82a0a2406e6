"""Drives the gateway's video player page in headless Chromium over the
DevTools protocol (gateway/tests/player.rs starts the gateway and the
browser): enters the key, creates a stream, and checks that frames are
drawn and change, that pausing stops playback and resuming restarts it,
that a prompt switch brings the new epoch on screen, that the key is kept
nowhere but the tab's memory, and that the page ran with no error (its
Content Security Policy included). Saves a screenshot. Prints OK.

Then attaches to a stream created through the API and plays it too.

With CHECK=bounds instead (a gateway whose policy lets generation run
minutes ahead of playback): an open-ended stream is created and its chunks
arrive far faster than 16 fps plays them; the player's frame queue stays at
its bound (2,048 frames) and its log at 200 lines, the newest kept.

Environment: DEVTOOLS_PORT_FILE (Chromium's DevToolsActivePort), API_KEY,
SCREENSHOT (where to write the PNG), GATEWAY (its base URL) and CA_FILE
(the CA that signed its certificate).
"""
import base64
import json
import os
import ssl
import sys
import time
import urllib.request

from websockets.sync.client import connect


def devtools_port():
    path = os.environ["DEVTOOLS_PORT_FILE"]
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(path) as f:
                first = f.readline().strip()
            if first:
                return int(first)
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    sys.exit("Chromium never wrote its DevTools port")


class Page:
    def __init__(self, url):
        self.ws = connect(url, max_size=None, open_timeout=10)
        self.next_id = 0
        self.problems = []

    def call(self, method, **params):
        self.next_id += 1
        me = self.next_id
        self.ws.send(json.dumps({"id": me, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == me:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.event(msg)

    def event(self, msg):
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.problems.append(f"exception: {params['exceptionDetails'].get('text')} "
                                 f"{params['exceptionDetails'].get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.problems.append(f"log: {params['entry']['text']}")
        elif method == "Runtime.consoleAPICalled" and params["type"] == "error":
            self.problems.append(f"console: {params['args']}")

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def state(self):
        return self.js("window.playerState()")

    def wait(self, what, pred, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            s = self.state()
            if pred(s):
                return s
            time.sleep(0.1)
        sys.exit(f"timed out waiting for {what}: {self.state()}\nlog: {self.log_text()}")

    def log_text(self):
        return self.js("document.getElementById('log').innerText")

    def click(self, button):
        self.js(f"document.getElementById({json.dumps(button)}).click()")

    def type(self, field, text):
        self.js(f"document.getElementById({json.dumps(field)}).value = {json.dumps(text)}")


def create_stream(key):
    """A stream created through the API, as another client would."""
    ctx = ssl.create_default_context(cafile=os.environ["CA_FILE"])
    req = urllib.request.Request(
        f"{os.environ['GATEWAY']}/v1/video/streams",
        data=json.dumps({"prompt": "waves on a beach", "length_frames": 120}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        return json.load(resp)["id"]


def bounds(page):
    """A feed far ahead of playback: the queue and the log stay bounded."""
    page.type("key", os.environ["API_KEY"])
    page.type("prompt", "an endless train ride")
    page.type("length", "")
    page.click("create")
    s = page.wait("a full frame queue", lambda s: s["queued"] >= 2048, timeout=90)
    lines = lambda: page.js("document.getElementById('log').children.length")
    page.wait("more chunks than the log keeps", lambda s: s["chunks"] > 260, timeout=90)
    for _ in range(5):  # chunks keep coming: the bound holds throughout
        s = page.state()
        assert s["queued"] <= 2048, f"the frame queue passed its bound: {s}"
        time.sleep(0.1)
    assert lines() == 200, f"the log kept {lines()} lines"
    newest = page.js("document.getElementById('log').firstChild.textContent")
    assert "chunk" in newest, newest
    page.click("end")
    s = page.wait("the end event", lambda s: s["ended"] is not None)
    assert s["errors"] == 0, f"the page reported errors: {page.log_text()}"
    assert not page.problems, f"the page had problems: {page.problems}"
    print(f"OK queued={s['queued']} chunks={s['chunks']} log={lines()}")


def main():
    port = devtools_port()
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
    page_target = next(t for t in targets if t["type"] == "page" and "/player" in t["url"])
    page = Page(page_target["webSocketDebuggerUrl"])
    page.call("Runtime.enable")
    page.call("Log.enable")
    deadline = time.time() + 20
    while page.js("typeof window.playerState") != "function":
        if time.time() > deadline:
            sys.exit(f"the player script never ran; problems: {page.problems}")
        time.sleep(0.1)
    if os.environ.get("CHECK") == "bounds":
        return bounds(page)

    # Create a stream of 20 chunks (240 frames at 16 fps: 15 s of video).
    page.type("key", os.environ["API_KEY"])
    page.type("prompt", "a red fox running through snow")
    page.type("length", "240")
    page.click("create")
    s = page.wait("the first frames", lambda s: s["drawn"] >= 4)
    first = s["digest"]
    s = page.wait("more frames", lambda s: s["drawn"] >= 16)
    assert s["digest"] != first, f"the picture never changed: {s}"
    assert s["epochsShown"] == [0], s

    # Pausing stops playback; resuming restarts it.
    page.click("pause")
    page.wait("the pause", lambda s: s["paused"])
    time.sleep(0.3)
    held = page.state()["drawn"]
    time.sleep(1.5)
    s = page.state()
    assert s["drawn"] == held, f"frames kept coming while paused: {held} -> {s['drawn']}"
    page.click("resume")
    page.wait("playback after resume", lambda s: not s["paused"] and s["drawn"] > held + 3)

    # A prompt switch brings the new epoch on screen.
    page.type("next-prompt", "the fox reaches a frozen lake")
    page.click("switch")
    s = page.wait("the new epoch on screen", lambda s: s["epoch"] == 1 and s["shownEpoch"] == 1)
    assert s["epochsShown"] == [0, 1], s
    overlay = page.js("document.getElementById('s-epoch').textContent")
    assert overlay == "1", overlay

    # The screenshot for the docs, with the overlay and the panel filled in.
    shot = page.call("Page.captureScreenshot", format="png")
    with open(os.environ["SCREENSHOT"], "wb") as f:
        f.write(base64.b64decode(shot["data"]))

    # The key is in the closure only: not in the form, storage or cookies.
    kept = page.js("[document.getElementById('key').value, localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == ["", 0, 0, ""], kept

    page.click("end")
    s = page.wait("the end event", lambda s: s["ended"] is not None)
    assert s["ended"] == "deleted", s

    # Attach to a stream created elsewhere (here by this script, with the
    # same key): the player reads its feed and plays it.
    other = create_stream(os.environ["API_KEY"])
    page.type("stream", other)
    page.click("attach")
    s = page.wait("the attached stream's frames", lambda s: s["stream"] == other and s["drawn"] >= 4)
    assert s["epochsShown"] == [0], s
    page.click("end")
    s = page.wait("the attached stream's end", lambda s: s["ended"] is not None)
    assert s["ended"] == "deleted", s
    assert s["errors"] == 0, f"the page reported errors: {page.log_text()}"
    assert not page.problems, f"the page had problems: {page.problems}"
    print(f"OK drawn={s['drawn']} chunks={s['chunks']} stalls={s['stalls']}")


if __name__ == "__main__":
    main()
