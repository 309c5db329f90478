#!/bin/sh
# pstar-run's behaviour, one case per CTest test:
#   check_run.sh CASE PSTAR_RUN HELPER
# HELPER is launch_helper.cpp built: it prints what it resolved from the
# environment ("rank=R world=W ... port=P source=S pid=N") and fails, sleeps
# or prints many lines as told.
set -u
name=$1
run=$2
helper=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pstar-run-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out
err=$tmp/err
: >"$out"
: >"$err"

fail() {
  echo "FAIL ($name): $*" >&2
  echo "--- stdout (first 40 lines)" >&2
  head -n 40 "$out" | cut -c 1-200 >&2
  echo "--- stderr (first 40 lines)" >&2
  head -n 40 "$err" | cut -c 1-200 >&2
  exit 1
}

# Runs pstar-run with the given arguments; sets rc and elapsed (seconds).
launch() {
  t0=$(date +%s)
  "$run" "$@" >"$out" 2>"$err"
  rc=$?
  elapsed=$(($(date +%s) - t0))
}

expect_rc() {
  [ "$rc" -eq "$1" ] || fail "exit status $rc, expected $1"
}

expect_within() {
  [ "$elapsed" -le "$1" ] || fail "took $elapsed s, expected at most $1 s"
}

# count FILE REGEX: the number of lines matching the extended regex.
count() {
  grep -E -c -- "$2" "$1"
}

expect_count() {
  n=$(count "$1" "$2")
  [ "$n" -eq "$3" ] || fail "$n lines of $1 match '$2', expected $3"
}

# Every pid a rank printed must be gone once pstar-run has returned.
expect_ranks_gone() {
  for pid in $(sed -n 's/.* pid=\([0-9][0-9]*\)$/\1/p' "$out"); do
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null
      fail "rank process $pid still runs after pstar-run returned"
    fi
  done
}

# Starts pstar-run in the background with every rank sleeping, waits until
# all N say so, sends SIGNAL to pstar-run and expects status RC.
signal_case() {
  sig=$1
  expect=$2
  n=3
  "$run" -n $n "$helper" --sleep all >"$out" 2>"$err" &
  pid=$!
  tries=0
  while [ "$(count "$out" '^\[rank [0-9]+\] sleeping rank=')" -lt $n ]; do
    tries=$((tries + 1))
    if [ $tries -gt 300 ]; then
      kill -KILL "$pid" 2>/dev/null
      fail "the ranks did not start"
    fi
    sleep 0.1
  done
  t0=$(date +%s)
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  elapsed=$(($(date +%s) - t0))
  expect_rc "$expect"
  expect_within 3
  grep -q "pstar-run: got signal" "$err" || fail "no message about the signal"
  expect_ranks_gone
}

case $name in
env)
  # Values from an outer launcher must not leak into the ranks.
  export RANK=7 WORLD_SIZE=9 LOCAL_RANK=5 LOCAL_WORLD_SIZE=9 MASTER_PORT=1 MASTER_ADDR=elsewhere
  launch -n 4 "$helper"
  expect_rc 0
  for k in 0 1 2 3; do
    expect_count "$out" "^\[rank $k\] rank=$k world=4 local_rank=$k local_world=4 addr=127\.0\.0\.1 port=[0-9]+ source=torchrun pid=[0-9]+$" 1
    expect_count "$err" "^\[rank $k\] stderr of rank=$k$" 1
  done
  expect_count "$out" '' 4
  expect_count "$err" '' 4
  ports=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' "$out" | sort -u)
  [ "$(echo "$ports" | wc -l)" -eq 1 ] || fail "the ranks got different ports: $ports"
  [ "$ports" -ge 1 ] && [ "$ports" -le 65535 ] && [ "$ports" -ne 1 ] || fail "port $ports"
  pids=$(sed -n 's/.* pid=\([0-9]*\)$/\1/p' "$out" | sort -u | wc -l)
  [ "$pids" -eq 4 ] || fail "$pids distinct processes, expected 4"
  ;;
options)
  # --nproc=N, -nN, --port, --master-addr and the "--" separator.
  launch --nproc=2 --port 29517 --master-addr localhost -- "$helper"
  expect_rc 0
  expect_count "$out" '^\[rank [01]\] rank=[01] world=2 local_rank=[01] local_world=2 addr=localhost port=29517 source=torchrun' 2
  launch -n1 --port=4242 "$helper"
  expect_rc 0
  expect_count "$out" '^\[rank 0\] rank=0 world=1 local_rank=0 local_world=1 addr=127\.0\.0\.1 port=4242 source=torchrun' 1
  ;;
fail)
  # Rank 1 fails after 300 ms; ranks 0 and 2 would sleep for ever.
  launch -n 3 "$helper" --exit 1 7 --delay-ms 300 --sleep 0 --sleep 2
  expect_rc 7
  expect_within 10
  grep -q '^pstar-run: rank 1 exited with status 7' "$err" || fail "no message naming rank 1"
  expect_count "$out" '^\[rank [02]\] sleeping rank=[02]$' 2
  expect_ranks_gone
  ;;
signal)
  # A rank killed by a signal: 128 + the signal's number.
  launch -n 2 "$helper" --raise 1 9 --delay-ms 200 --sleep 0
  expect_rc 137
  expect_within 10
  grep -q '^pstar-run: rank 1 was killed by signal 9' "$err" || fail "no message naming rank 1"
  expect_ranks_gone
  ;;
success_and_failure)
  # Ranks that finish successfully do not end the run; the one failure does.
  launch -n 4 "$helper" --exit 3 5 --delay-ms 500
  expect_rc 5
  expect_count "$out" '^\[rank [0-3]\] rank=' 4
  ;;
timeout)
  launch -n 2 --timeout 1 "$helper" --sleep all
  expect_rc 124
  expect_within 10
  grep -q '^pstar-run: timeout after 1 s' "$err" || fail "no timeout message"
  expect_ranks_gone
  ;;
escalate)
  # Ranks that ignore SIGTERM get SIGKILL after the grace period (the
  # default grace of 5 s would exceed the bound).
  launch -n 2 --timeout 1 --grace 1 "$helper" --sleep all --ignore-term
  expect_rc 124
  expect_within 5
  expect_count "$out" '^\[rank [01]\] sleeping rank=[01]$' 2
  expect_ranks_gone
  ;;
sigterm)
  signal_case TERM 143
  ;;
sigint)
  signal_case INT 130
  ;;
lines)
  # Many long lines from 4 ranks at once: every line whole, with its own
  # rank's prefix, in order; partial last lines flushed at exit.
  launch -n 4 "$helper" --lines 3000 --width 200 --partial
  expect_rc 0
  awk -v ranks=4 -v lines=3000 -v width=200 '
    $1 == "[rank" && $2 ~ /^[0-9]+\]$/ {
      k = substr($2, 1, length($2) - 1)
      if ($0 == "[rank " k "] tail of rank=" k) next
      if ($3 != "rank=" k) { print "line of rank " $3 " under prefix " k ": " substr($0, 1, 80); bad = 1; next }
      if ($4 ~ /^line=/) {
        if (NF != 5 || $4 != "line=" seen[k] + 0 || length($5) != width) {
          print "bad line: " substr($0, 1, 80); bad = 1
        }
        seen[k]++
        next
      }
      if ($4 ~ /^world=/) next
    }
    { print "unexpected line: " substr($0, 1, 80); bad = 1 }
    END {
      for (k = 0; k < ranks; k++)
        if (seen[k] != lines) { print "rank " k ": " seen[k] + 0 " lines"; bad = 1 }
      exit bad
    }' "$out" >"$tmp/awk" || { cat "$tmp/awk" >&2; fail "malformed output"; }
  for k in 0 1 2 3; do
    expect_count "$out" "^\[rank $k\] tail of rank=$k$" 1
    expect_count "$err" "^\[rank $k\] error tail of rank=$k$" 1
  done
  ;;
long_line)
  # A line longer than 64 KiB is written in pieces of 64 KiB, each prefixed.
  launch -n 1 "$helper" --lines 1 --width 150000
  expect_rc 0
  expect_count "$out" '^\[rank 0\] ' 4
  expect_count "$out" '' 4
  n=$(sed -n '2,$s/^\[rank 0\] //p' "$out" | tr -d '\n' | sed 's/^rank=0 line=0 //' | tr -cd a | wc -c)
  [ "$n" -eq 150000 ] || fail "$n characters of the long line came through, expected 150000"
  ;;
usage)
  for args in "" "-n 0 $helper" "-n 2" "-n 1025 $helper" "-n x $helper" "--port 70000 -n 1 $helper" \
              "--port 0 -n 1 $helper" "--timeout 0 -n 1 $helper" "--timeout -1 -n 1 $helper" \
              "--grace abc -n 1 $helper" "--bogus -n 1 $helper" "-n"; do
    # shellcheck disable=SC2086  # split on purpose
    launch $args
    expect_rc 2
    grep -q '^usage: pstar-run' "$err" || fail "no usage text for '$args'"
    [ ! -s "$out" ] || fail "a rank ran for '$args'"
  done
  launch --help
  expect_rc 0
  grep -q '^usage: pstar-run' "$out" || fail "--help prints no usage"
  ;;
missing)
  launch -n 2 pstar-surely-not-a-command-4711
  expect_rc 127
  grep -q 'pstar-surely-not-a-command-4711: command not found' "$err" || fail "no message"
  launch -n 2 "$tmp/nonexistent"
  expect_rc 127
  # The other rank may be stopped before it gets as far as exec.
  [ "$(count "$err" "^\[rank [01]\] pstar-run: cannot execute $tmp/nonexistent")" -ge 1 ] ||
    fail "no message from a rank"
  ;;
*)
  echo "unknown case $name" >&2
  exit 2
  ;;
esac
echo "ok ($name)"
