// The gateway's live video player (GET /player). Creates or attaches to a
// stream, reads its SSE feed with fetch (EventSource cannot send the API
// key), decodes each chunk's PNG frames and plays them on a canvas at the
// stream's frame rate from the moment the first chunk arrives, and lays
// over the picture what the scheduler knows: slack, credit and urgency
// (polled from the stream's status), each chunk's fidelity, stalls and
// re-homes. The key lives in this closure only: never in storage, never in
// the URL. `window.playerState()` reports the player's state (the browser
// test reads it).
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const canvas = $('screen');
  const ctx = canvas.getContext('2d');
  ctx.imageSmoothingEnabled = false;

  let key = '';
  let stream = null; // {id, fps, framesPerChunk}
  let epoch = 0; // the newest prompt epoch this player knows of
  const queue = []; // frames to play: {img, epoch, index, chunk}
  let shown = null; // the frame on screen
  let drawn = 0; // frames drawn
  let epochsShown = new Set();
  let paused = false;
  let started = false; // playback starts with the first chunk
  let ended = null;
  let status = null; // the last status document
  let stalls = 0;
  let chunks = 0;
  let lastEngine = null;
  let rehomesSeen = 0;
  let lastFrameAt = 0;
  let feed = null; // AbortController of the feed
  let poller = null;
  let errors = 0;
  const MAX_QUEUED_FRAMES = 2048; // a bound on memory if playback lags far behind

  function log(text, cls) {
    const li = document.createElement('li');
    li.textContent = `${new Date().toISOString().slice(11, 23)} ${text}`;
    if (cls) li.className = cls;
    const list = $('log');
    list.prepend(li);
    while (list.children.length > 200) list.lastChild.remove();
  }

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${key}` };
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await resp.text();
    let value = null;
    try { value = JSON.parse(text); } catch (_) { /* not JSON */ }
    if (!resp.ok) {
      const e = value && value.error ? `${value.error.code}: ${value.error.message}` : text;
      throw new Error(`${resp.status} ${e}`);
    }
    return value;
  }

  function fail(e) {
    errors += 1;
    log(String(e.message || e), 'error');
  }

  // --- the feed -----------------------------------------------------------

  async function readFeed(id) {
    feed = new AbortController();
    const resp = await fetch(`/v1/video/streams/${encodeURIComponent(id)}/events`, {
      headers: { Authorization: `Bearer ${key}` }, signal: feed.signal,
    });
    if (!resp.ok) throw new Error(`${resp.status} ${await resp.text()}`);
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      for (let m = buf.match(/\r?\n\r?\n/); m; m = buf.match(/\r?\n\r?\n/)) {
        const block = buf.slice(0, m.index);
        buf = buf.slice(m.index + m[0].length);
        dispatch(block);
      }
    }
  }

  function dispatch(block) {
    let event = 'message';
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let v = colon < 0 ? '' : line.slice(colon + 1);
      if (v.startsWith(' ')) v = v.slice(1);
      if (field === 'event') event = v;
      if (field === 'data') data.push(v);
    }
    if (!data.length) return;
    const d = JSON.parse(data.join('\n'));
    if (event === 'chunk') onChunk(d);
    else if (event === 'stall') { stalls += 1; log(`stall: chunk ${d.index} late by ${d.late_ms.toFixed(0)} ms`, 'error'); }
    else if (event === 'end') onEnd(d);
  }

  function onChunk(c) {
    chunks += 1;
    if (c.prompt_epoch < epoch) {
      log(`chunk ${c.index} of epoch ${c.prompt_epoch} dropped (epoch ${epoch} is current)`);
      return;
    }
    if (c.prompt_epoch > epoch) setEpoch(c.prompt_epoch);
    if (lastEngine !== null && c.engine !== lastEngine) {
      rehomesSeen += 1;
      log(`re-homed: ${lastEngine} → ${c.engine}`);
    }
    lastEngine = c.engine;
    log(`chunk ${c.index} · epoch ${c.prompt_epoch} · ${c.fidelity.label} (${c.mode}) · ${c.engine} · slack ${c.slack_ms.toFixed(0)} ms`);
    for (const f of c.frames) {
      if (queue.length >= MAX_QUEUED_FRAMES) queue.shift();
      const img = new Image();
      img.src = `data:image/png;base64,${f}`;
      queue.push({ img, epoch: c.prompt_epoch, index: c.index, chunk: c });
    }
    started = true;
  }

  function onEnd(d) {
    ended = d;
    log(`end: ${d.reason} · ${d.chunks} chunks · CPR ${(d.cpr * 100).toFixed(1)}% · ${d.stalls} stalls · ${d.rehomes} re-homes`);
    setButtons();
  }

  /// A new prompt epoch: frames of older epochs are never shown.
  function setEpoch(e) {
    epoch = e;
    for (let i = queue.length - 1; i >= 0; i -= 1) if (queue[i].epoch < e) queue.splice(i, 1);
  }

  // --- playback -----------------------------------------------------------

  function frame(now) {
    requestAnimationFrame(frame);
    const fps = stream ? stream.fps : 16;
    if (started && !paused && now - lastFrameAt >= 1000 / fps && queue.length && queue[0].img.complete) {
      shown = queue.shift();
      lastFrameAt = now;
      drawn += 1;
      epochsShown.add(shown.epoch);
    }
    draw();
  }

  function draw() {
    ctx.fillStyle = '#111';
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    if (shown) ctx.drawImage(shown.img, 0, 0, canvas.width, canvas.height);
    // The overlay: what the scheduler knows.
    const lines = [];
    if (shown) {
      const c = shown.chunk;
      lines.push(`epoch ${shown.epoch} · chunk ${shown.index} · ${c.fidelity.label} (${c.mode})`);
    }
    if (status) {
      lines.push(`slack ${status.slack_ms.toFixed(0)} ms · credit ${status.credit_ms.toFixed(0)} ms · ${status.urgency}`);
    }
    lines.push(`stalls ${Math.max(stalls, status ? status.stalls : 0)} · re-homes ${Math.max(rehomesSeen, status ? status.rehomes : 0)}`);
    if (paused) lines.push('PAUSED');
    else if (started && !queue.length && !ended) lines.push('buffering…');
    if (ended) lines.push(`ended: ${ended.reason}`);
    ctx.font = '13px ui-monospace, monospace';
    const w = Math.max(...lines.map((l) => ctx.measureText(l).width)) + 16;
    ctx.fillStyle = 'rgba(0, 0, 0, 0.6)';
    ctx.fillRect(0, 0, w, lines.length * 17 + 10);
    ctx.fillStyle = '#fff';
    lines.forEach((l, i) => ctx.fillText(l, 8, 20 + i * 17));
    panel();
  }

  function panel() {
    const set = (id, v) => { $(id).textContent = v; };
    set('s-drawn', String(drawn));
    set('s-stalls', String(Math.max(stalls, status ? status.stalls : 0)));
    set('s-rehomes', String(Math.max(rehomesSeen, status ? status.rehomes : 0)));
    set('s-epoch', String(epoch));
    if (shown) {
      set('s-chunk', String(shown.index));
      set('s-fidelity', `${shown.chunk.fidelity.label} (${shown.chunk.mode}, quality ${shown.chunk.quality.toFixed(3)})`);
      set('s-engine', shown.chunk.engine);
    }
    if (status) {
      set('s-status', ended ? `ended (${ended.reason})` : status.status);
      set('s-slack', `${status.slack_ms.toFixed(0)} ms`);
      set('s-credit', `${status.credit_ms.toFixed(0)} ms`);
      set('s-urgency', status.urgency);
      $('s-urgency').className = status.urgency;
    }
  }

  async function poll() {
    if (!stream || ended) return;
    try {
      status = await api('GET', `/v1/video/streams/${encodeURIComponent(stream.id)}`);
      if (status.prompt_epoch > epoch) setEpoch(status.prompt_epoch);
    } catch (e) {
      fail(e);
    }
  }

  // --- controls -----------------------------------------------------------

  function setButtons() {
    const live = Boolean(stream) && !ended;
    $('pause').disabled = !live || paused;
    $('resume').disabled = !live || !paused;
    $('switch').disabled = !live;
    $('end').disabled = !live;
    $('create').disabled = live;
    $('attach').disabled = live;
  }

  function takeKey() {
    key = $('key').value.trim();
    $('key').value = ''; // out of the form: only this closure holds it
    if (!key) throw new Error('enter an API key first');
  }

  /// Forgets the previous stream (a player plays one at a time).
  function reset() {
    if (feed) feed.abort();
    queue.length = 0;
    shown = null;
    drawn = 0;
    chunks = 0;
    stalls = 0;
    epoch = 0;
    epochsShown = new Set();
    paused = false;
    started = false;
    ended = null;
    status = null;
    lastEngine = null;
    rehomesSeen = 0;
  }

  async function start(id, fps, framesPerChunk) {
    stream = { id, fps, framesPerChunk };
    $('s-id').textContent = id;
    $('stream').value = id;
    setButtons();
    poller = setInterval(poll, 500);
    poll();
    try {
      await readFeed(id);
    } catch (e) {
      if (e.name !== 'AbortError') fail(e);
    } finally {
      clearInterval(poller);
      setButtons();
    }
  }

  $('create').addEventListener('click', async () => {
    try {
      if (!key) takeKey();
      reset();
      const body = { prompt: $('prompt').value };
      const len = parseInt($('length').value, 10);
      if (len > 0) body.length_frames = len;
      const s = await api('POST', '/v1/video/streams', body);
      log(`created ${s.id} on ${s.home_engine}: ${s.fps} fps, ${s.frames_per_chunk} frames a chunk, initial slack ${s.initial_slack_ms.toFixed(0)} ms`);
      start(s.id, s.fps, s.frames_per_chunk);
    } catch (e) {
      fail(e);
    }
  });

  $('attach').addEventListener('click', async () => {
    try {
      if (!key) takeKey();
      const id = $('stream').value.trim();
      const s = await api('GET', `/v1/video/streams/${encodeURIComponent(id)}`);
      reset();
      status = s;
      epoch = s.prompt_epoch;
      log(`attached to ${id} (${s.status}, epoch ${s.prompt_epoch}, ${s.chunks} chunks so far)`);
      start(id, s.fps, s.frames_per_chunk);
    } catch (e) {
      fail(e);
    }
  });

  /// Pause or resume: the stream's playout clock and this player's.
  async function playback(action, pause) {
    try {
      status = await api('POST', `/v1/video/streams/${encodeURIComponent(stream.id)}/${action}`);
      paused = pause;
      log(pause ? 'paused' : 'resumed');
      setButtons();
    } catch (e) {
      fail(e);
    }
  }

  $('pause').addEventListener('click', () => playback('pause', true));
  $('resume').addEventListener('click', () => playback('resume', false));

  $('switch').addEventListener('click', async () => {
    try {
      const prompt = $('next-prompt').value;
      status = await api('POST', `/v1/video/streams/${encodeURIComponent(stream.id)}/prompt`, { prompt });
      setEpoch(status.prompt_epoch);
      log(`prompt switched: epoch ${status.prompt_epoch} “${prompt}”`);
    } catch (e) {
      fail(e);
    }
  });

  $('end').addEventListener('click', async () => {
    try {
      await api('DELETE', `/v1/video/streams/${encodeURIComponent(stream.id)}`);
    } catch (e) {
      fail(e);
    }
  });

  window.addEventListener('pagehide', () => { if (feed) feed.abort(); });

  /// A digest of the picture's lower half (below the overlay): changes when
  /// the frames do.
  function pictureDigest() {
    const { data } = ctx.getImageData(0, canvas.height / 2, canvas.width, canvas.height / 2);
    let h = 2166136261;
    for (let i = 0; i < data.length; i += 7) h = Math.imul(h ^ data[i], 16777619) >>> 0;
    return h;
  }

  window.playerState = () => ({
    stream: stream && stream.id,
    drawn,
    queued: queue.length,
    chunks,
    epoch,
    shownEpoch: shown ? shown.epoch : null,
    epochsShown: [...epochsShown],
    paused,
    stalls,
    ended: ended && ended.reason,
    errors,
    urgency: status && status.urgency,
    digest: pictureDigest(),
  });

  setButtons();
  requestAnimationFrame(frame);
})();
