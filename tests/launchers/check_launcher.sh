#!/bin/sh
# The C example on 2 ranks under each launcher docs/launching.md names, one
# case per CTest test (label dist):
#   check_launcher.sh CASE PSTAR_RUN EXAMPLE VENV_BIN REFERENCE_FILE
# CASE: reference (pstar-run -n 2; writes REFERENCE_FILE), torchrun_standalone,
# torchrun_c10d, torchrun_two_nodes, torchrun_restart, mpirun, slurm_env.  Every other case
# trains the same model for the same steps and must end at the same held-out
# loss as the reference, on every rank.  A launcher that is not installed
# makes the case exit 77 (skipped), saying so.
set -u
name=$1
run=$2
example=$3
venv_bin=$4
reference=$5
steps=30
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pstar-launcher-test.XXXXXX") || exit 1
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
out=$tmp/out
: >"$out"

fail() {
  echo "FAIL ($name): $*" >&2
  echo "--- output (last 60 lines)" >&2
  tail -n 60 "$out" | cut -c 1-240 >&2
  exit 1
}

skip() {
  echo "skipped: $*"
  exit 77
}

# A TCP port free on loopback now (the kernel's pick; released at once).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The distinct "held-out loss: B before, A after" lines of the output, with
# any "[rank k] " prefix removed, one per line.
final_losses() {
  sed -n 's/^\(\[rank [0-9]*\] \)\{0,1\} *held-out loss: *//p' "$out" | sort -u
}

# Checks that both ranks trained as ranks 0 and 1 of one group, reported,
# and agree with the reference.
expect_reference_loss() {
  for r in 0 1; do
    grep -q "data parallel: rank $r of 2" "$out" || fail "no line says rank $r of 2 trained"
  done
  count=$(grep -c "held-out loss:" "$out")
  [ "$count" -eq 2 ] || fail "expected the summary of 2 ranks, found $count"
  got=$(final_losses)
  want=$(cat "$reference") || fail "no reference loss (the dist_launcher_reference test writes it)"
  [ "$got" = "$want" ] || fail "final loss '$got' differs from pstar-run's '$want'"
  echo "$name: both ranks end at held-out loss $got, as under pstar-run -n 2"
}

# Waits for the background processes in $pids, then puts their outputs
# (the files given) into $out; fails if any exited non-zero.
wait_all() {
  rc=0
  for p in $pids; do wait "$p" || rc=$?; done
  pids=""
  cat "$@" >"$out"
  [ "$rc" -eq 0 ] || fail "a process exited $rc"
}

torchrun=$venv_bin/torchrun
need_torchrun() {
  [ -x "$torchrun" ] || skip "torchrun not found at $torchrun (packaging/setup-venv.sh installs PyTorch)"
}

case "$name" in
  reference)
    "$run" -n 2 --timeout 100 -- "$example" --steps "$steps" >"$out" 2>&1 || fail "pstar-run exited $?"
    count=$(grep -c "held-out loss:" "$out")
    [ "$count" -eq 2 ] || fail "expected the summary of 2 ranks, found $count"
    [ "$(final_losses | wc -l)" -eq 1 ] || fail "the ranks disagree: $(final_losses)"
    final_losses >"$reference"
    echo "reference (pstar-run -n 2): held-out loss $(cat "$reference")"
    ;;
  torchrun_standalone)
    need_torchrun
    timeout 100 "$torchrun" --standalone --nproc-per-node 2 --no-python \
      "$example" --steps "$steps" >"$out" 2>&1 || fail "torchrun exited $?"
    expect_reference_loss
    ;;
  torchrun_c10d)
    need_torchrun
    port=$(free_port)
    timeout 100 "$torchrun" --nnodes 1 --nproc-per-node 2 --rdzv-backend=c10d \
      --rdzv-endpoint="localhost:$port" --no-python "$example" --steps "$steps" >"$out" 2>&1 ||
      fail "torchrun exited $?"
    expect_reference_loss
    ;;
  torchrun_two_nodes)
    # Two nodes simulated on one host: two torchrun agents, one rank each,
    # node 0's agent serving the store on the master port.
    need_torchrun
    port=$(free_port)
    for node in 0 1; do
      timeout 100 "$torchrun" --nnodes 2 --nproc-per-node 1 --node-rank "$node" \
        --master-addr 127.0.0.1 --master-port "$port" --no-python \
        "$example" --steps "$steps" >"$tmp/node$node" 2>&1 &
      pids="$pids $!"
    done
    wait_all "$tmp/node0" "$tmp/node1"
    expect_reference_loss
    ;;
  torchrun_restart)
    # A restarted attempt: on attempt 0 both ranks form their group and
    # train 2 steps, then rank 1 fails; torchrun restarts both (the agent's
    # store, with attempt 0's keys, lives on) and attempt 1 must train as
    # if alone: its keys are under libpstar/attempt_1/, never attempt 0's.
    need_torchrun
    cat >"$tmp/attempt.sh" <<SCRIPT
#!/bin/sh
if [ "\$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  "$example" --steps 2 >"$tmp/attempt0-rank\$RANK" 2>&1 || exit \$?
  [ "\$RANK" = 1 ] && exit 3
  exit 0
fi
exec "$example" --steps $steps
SCRIPT
    chmod +x "$tmp/attempt.sh"
    timeout 100 "$torchrun" --standalone --nproc-per-node 2 --max-restarts 1 --no-python \
      "$tmp/attempt.sh" >"$out" 2>&1 || fail "torchrun exited $?"
    grep -q "data parallel: rank 1 of 2" "$tmp/attempt0-rank1" || fail "attempt 0 did not form its group"
    expect_reference_loss
    ;;
  mpirun)
    command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (packaging/setup-debian.sh installs openmpi-bin)"
    port=$(free_port)
    # Open MPI refuses root without these; --oversubscribe: the host may
    # have fewer cores than ranks.
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 100 mpirun -np 2 --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      "$example" --steps "$steps" >"$out" 2>&1 || fail "mpirun exited $?"
    expect_reference_loss
    ;;
  slurm_env)
    # What srun gives each task of a one-node, two-task step, and the
    # rendezvous address a batch script exports (docs/launching.md).
    port=$(free_port)
    for r in 0 1; do
      env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
        SLURM_PROCID=$r SLURM_LOCALID=$r SLURM_NTASKS=2 SLURM_NODEID=0 SLURM_TASKS_PER_NODE=2 \
        SLURM_JOB_NODELIST=localhost MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
        timeout 100 "$example" --steps "$steps" >"$tmp/task$r" 2>&1 &
      pids="$pids $!"
    done
    wait_all "$tmp/task0" "$tmp/task1"
    expect_reference_loss
    ;;
  *)
    echo "unknown case $name" >&2
    exit 2
    ;;
esac
