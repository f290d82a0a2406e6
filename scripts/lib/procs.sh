# Processes a script starts, and how it ends them: by the process ids it
# recorded, never by a name (a name can match a process the script did not
# start on a shared machine). Source it, then:
#
#   spawn LOG CMD ARGS...   start CMD in the background, output to LOG; the
#                           PID is in $SPAWNED and recorded for stop_all
#   wait_ready LOG [TRIES]  wait (0.2 s a try, 100 by default) for a line
#                           starting `ready:` in LOG; fails if none came
#   stop PID [SECONDS]      SIGINT (a gateway stops its engines on it), up
#                           to SECONDS (10), then SIGKILL; waits for it
#   wait_url URL [TRIES]    wait (0.2 s a try, 300 by default) until URL
#                           answers 2xx (curl, any certificate)
#   stop_all                stop every recorded PID still running; installed
#                           as the EXIT trap (a script with a trap of its own
#                           calls stop_all from it)
#   build_release PKG...    cargo build --release -p PKG..., unless NO_BUILD
#                           is set (a benchmark queue with prebuilt binaries)
#   gateway_up LOG ARGS...  spawn `target/release/gateway ARGS...` (`up` or
#                           `serve`), wait up to 60 s for its ready line;
#                           on failure print the log's tail and exit 1. The
#                           PID is in $SPAWNED
#
# Every bench-* script starts, runs and stops its processes through these,
# and writes under bench-out/NAME/ (OUT overrides).

SPAWNED_PIDS=()

spawn() { # log cmd args...
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  SPAWNED=$!
  SPAWNED_PIDS+=("$SPAWNED")
}

wait_ready() { # log [tries]
  local i
  for ((i = 0; i < ${2:-100}; i++)); do
    grep -q '^ready:' "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "not ready after $(( ${2:-100} / 5 )) s: $1" >&2
  return 1
}

stop() { # pid [seconds]
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -INT "$pid" 2>/dev/null || true
  for ((i = 0; i < ${2:-10} * 5; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

wait_url() { # url [tries]
  local i
  for ((i = 0; i < ${2:-300}; i++)); do
    curl -sfk "$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "not answering: $1" >&2
  return 1
}

build_release() { # packages...
  [ -n "${NO_BUILD:-}" ] && return 0
  local args=() p
  for p in "$@"; do args+=(-p "$p"); done
  cargo build --release -q "${args[@]}"
}

gateway_up() { # log gateway-args...
  local log=$1; shift
  spawn "$log" target/release/gateway "$@"
  wait_ready "$log" 300 || { tail -n 30 "$log" >&2; exit 1; }
}

stop_all() {
  local pid
  for pid in "${SPAWNED_PIDS[@]}"; do stop "$pid"; done
  SPAWNED_PIDS=()
}

trap stop_all EXIT
