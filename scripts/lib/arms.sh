# The arms of the admission benchmark, shared by scripts/bench-admission and
# scripts/sim-calibrate (loadtest sim --arm applies the same edits in code):
#   b0    FCFS, round robin, no admission, static micro-batches of 4
#   b1    FCFS, least loaded (fewest requests), no admission, length-oblivious
#         continuous batching capped at 8
#   ours  SLO admission + degradation ladder + brownout + DRR gate +
#         predicted-finish routing, continuous batching capped at 8
#   ours-preempt  ours with priority preemption at token boundaries
#         ([admission] preempt_lower_tiers = true)

# The baselines' policy: the shipped document with admission, brownout and
# the product's routing switched off. Every edit must apply.
baseline_policy() { # routing-policy out-dir -> file
  local f="$2/$1.policy.toml"
  sed -e 's/^mode = "slo"/mode = "off"/' -e "s/^policy = \"predicted_finish\"/policy = \"$1\"/" \
      -e 's/^order = "wsrpt"/order = "fcfs"/' -e 's/^enabled = true/enabled = false/' \
      policies/default.toml >"$f"
  for want in 'mode = "off"' "policy = \"$1\"" 'order = "fcfs"' 'enabled = false'; do
    grep -q "^$want" "$f" || { echo "baseline policy: could not set $want" >&2; exit 1; }
  done
  echo "$f"
}

# Sets ARM_POLICY and ARM_ARGS (gateway up flags) for arm $1, files in $2.
arm_setup() {
  case $1 in
    b0) ARM_POLICY=$(baseline_policy round_robin "$2")
        ARM_ARGS=(--engine-arg=--batching=static --engine-arg=--max-batch=4) ;;
    b1) ARM_POLICY=$(baseline_policy least_loaded "$2")
        ARM_ARGS=(--engine-arg=--max-batch=8 --engine-arg=--split-ratio=1000000
                  --engine-arg=--reserved-long-slots=0 --engine-arg=--max-long-per-prefill=8) ;;
    ours) ARM_POLICY=policies/default.toml
        ARM_ARGS=(--engine-arg=--max-batch=8) ;;
    ours-preempt) ARM_POLICY="$2/ours-preempt.policy.toml"
        sed 's/^recheck_factor = \(.*\)$/recheck_factor = \1\npreempt_lower_tiers = true/' policies/default.toml >"$ARM_POLICY"
        grep -q '^preempt_lower_tiers = true' "$ARM_POLICY" || { echo "could not set preempt_lower_tiers" >&2; exit 1; }
        ARM_ARGS=(--engine-arg=--max-batch=8) ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}
