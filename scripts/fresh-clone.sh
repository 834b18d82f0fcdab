#!/usr/bin/env bash
# README's two commands as a newcomer runs them: in a fresh `git clone` of
# this checkout's commit, in a temporary directory. The commands are read
# from README's section "The two commands" (its first code block is the run
# command, its second the test command), so README and CI cannot drift apart.
#
# 1. The test command, once, in the clone (it starts and installs what the
#    tests need when missing, then runs every test). Arguments given to this
#    script are passed on to it (e.g. a nextest filter, for a quick check).
# 2. The run command, started in the clone: GET /readyz must answer 200, and
#    SIGTERM must stop it with exit status 0. `cargo run -p` resolves the
#    features of that one package, not the workspace's, so its first run in
#    a target dir builds part of the dependencies again: the wait for /readyz
#    allows for that build (RUN_READY_TIMEOUT seconds, default 1800), and
#    fails at once if the command exits.
#
# CARGO_TARGET_DIR is this checkout's target/ unless set, so the clone reuses
# what is already compiled: only the workspace's own crates are built again.
# The clone holds committed work only: uncommitted changes are not in it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

log() { printf '\n== %s\n' "$*" >&2; }

# The code blocks of README's "The two commands", one "BLOCK<TAB>LINE" per
# line of their contents, blocks numbered from 0.
blocks=$(awk '
  /^## / { section = ($0 == "## The two commands"); next }
  section && /^```/ { if (inside) { inside = 0; n++ } else { inside = 1 }; next }
  section && inside { print n + 0 "\t" $0 }
  END { if (inside) exit 1 }
' README.md) || { echo "README.md: a code block of \"The two commands\" is not closed" >&2; exit 1; }
run_cmd=$(printf '%s\n' "$blocks" | awk -F'\t' '$1 == 0 { sub(/^[^\t]*\t/, ""); print }')
test_cmd=$(printf '%s\n' "$blocks" | awk -F'\t' '$1 == 1 { sub(/^[^\t]*\t/, ""); print }')
count=$(printf '%s\n' "$blocks" | awk -F'\t' 'NF { print $1 }' | sort -u | wc -l)
if [ "$count" -ne 2 ] || [ -z "$run_cmd" ] || [ -z "$test_cmd" ]; then
  echo "README.md: \"## The two commands\" must hold two code blocks, the run command then the test command (found $count)" >&2
  exit 1
fi
printf 'run command:  %s\ntest command: %s\n' "$run_cmd" "$test_cmd" >&2

commit=$(git rev-parse HEAD)
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "note: uncommitted changes are not in the clone; it is of commit $commit" >&2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/runlease-fresh-clone.XXXXXX")
coordinator=""
cleanup() {
  if [ -n "$coordinator" ] && kill -0 "$coordinator" 2>/dev/null; then
    kill -KILL -- "-$coordinator" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
clone="$tmp/runlease"
log "a fresh clone of $commit in $clone"
git clone --quiet --no-checkout "$root" "$clone"
# HEAD itself, even when no branch points at it (a detached CI checkout).
git -C "$clone" fetch --quiet "$root" "$commit"
git -C "$clone" checkout --quiet --detach "$commit"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"

log "README's test command, in the clone: $test_cmd $*"
(cd "$clone" && bash -euo pipefail -c "$test_cmd \"\$@\"" test-command "$@")

log "README's run command, in the clone: $run_cmd"
# A free port of this machine's choosing (8080 may be taken here), given as
# the setting every coordinator reads; the command itself is as README says.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run_log="$tmp/run.log"
# A session of its own, so the stop below reaches cargo and what it runs.
(cd "$clone" && RUNLEASE_LISTEN="127.0.0.1:$port" exec setsid bash -c "$run_cmd") >"$run_log" 2>&1 &
coordinator=$!
ready=""
ready_timeout=${RUN_READY_TIMEOUT:-1800}
started=$SECONDS
while [ $((SECONDS - started)) -lt "$ready_timeout" ]; do
  if ! kill -0 "$coordinator" 2>/dev/null; then
    tail -n 40 "$run_log" >&2
    echo "the run command exited before /readyz answered" >&2
    exit 1
  fi
  if ready=$(curl -fsS "http://127.0.0.1:$port/readyz" 2>/dev/null); then
    break
  fi
  ready=""
  sleep 0.2
done
if [ -z "$ready" ]; then
  tail -n 40 "$run_log" >&2
  echo "the run command did not answer /readyz on 127.0.0.1:$port within $ready_timeout s" >&2
  exit 1
fi
echo "GET /readyz after $((SECONDS - started)) s: $ready" >&2
kill -TERM -- "-$coordinator"
for _ in $(seq 1 400); do
  kill -0 "$coordinator" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$coordinator" 2>/dev/null; then
  tail -n 40 "$run_log" >&2
  echo "the run command was still running 40 s after SIGTERM" >&2
  exit 1
fi
status=0
wait "$coordinator" || status=$?
coordinator=""
if [ "$status" -ne 0 ]; then
  tail -n 40 "$run_log" >&2
  echo "the run command exited $status after SIGTERM (0 expected: a drained stop)" >&2
  exit 1
fi
echo "stopped by SIGTERM, exit status 0" >&2
