# Processes a script starts, and how it ends them: by the process ids it
# recorded, never by a name (a name can match a process the script did not
# start on a shared machine). Source it, then:
#
#   spawn LOG CMD ARGS...   start CMD in the background, output to LOG; the
#                           PID is in $SPAWNED and recorded for stop_all
#   wait_ready LOG [TRIES]  wait (0.2 s a try, 100 by default) for a line
#                           starting `ready:` in LOG; fails if none came
#   stop PID                SIGINT (a gateway stops its engines on it), up
#                           to 10 s, then SIGKILL; waits for it
#   stop_all                stop every recorded PID still running; installed
#                           as the EXIT trap (a script with a trap of its own
#                           calls stop_all from it)

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

stop() { # pid
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -INT "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

stop_all() {
  local pid
  for pid in "${SPAWNED_PIDS[@]}"; do stop "$pid"; done
  SPAWNED_PIDS=()
}

trap stop_all EXIT
