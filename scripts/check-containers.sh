#!/usr/bin/env bash
# Real containers, no Docker engine: builds infra/Dockerfile with podman and
# runs the image, then brings infra/docker-compose.yml up with docker-compose
# talking to podman's Docker-compatible socket.
#
# 1. tools: podman, runc, debootstrap, docker-compose from Debian (apt-get,
#    only when missing);
# 2. base images: no registry is reachable, so the images the Dockerfile and
#    the compose file name are made here from Debian's packages (debootstrap)
#    and this machine's Rust toolchain (infra/stand-ins/), each labelled with
#    a digest of its inputs and rebuilt only when they change;
# 3. the coordinator image: infra/Dockerfile as users build it, the base
#    images passed as build arguments (their defaults are the official ones);
# 4. the image run: against PostgreSQL and Redis in containers, migrations
#    applied, /readyz ready, the image's health check green, uid 10001, a job
#    enqueued through the published port done by the example worker's
#    container, SIGTERM drained within the compose file's stop grace period;
# 5. the compose file, unchanged, up with docker-compose: the same job, then
#    `down -v` leaves none of its containers, volumes or networks.
# Each step's duration is printed at the end. Any failure exits non-zero.
#
# State kept between runs (podman's image store, the build cache mounts, the
# files below) is this machine's: RUNLEASE_CONTAINERS_CACHE (default
# /var/cache/runlease-containers) holds containers.conf and the debootstrap
# scratch directory.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

cache="${RUNLEASE_CONTAINERS_CACHE:-/var/cache/runlease-containers}"
debian_release=bookworm
debian_mirror="${RUNLEASE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Stand-ins for the Dockerfile's base images live under this prefix; the
# compose file's images are tagged under the exact names it uses.
local_prefix=localhost/runlease-ci
inputs_label=org.runlease.ci.inputs
coordinator_image=localhost/runlease-coordinator:ci
compose_project=runlease-ci
image_size=""
# Containers, networks and volumes of step 4 are named with this prefix.
run_prefix=runlease-ci-run

log() { printf '\n== %s\n' "$*"; }
fail() {
  printf 'check-containers: %s\n' "$*" >&2
  exit 1
}

# Step timings, printed on exit whatever happened.
timings=()
timed() {
  local label="$1" start=$SECONDS
  shift
  log "$label"
  "$@"
  timings+=("$(printf '%4d s  %s' $((SECONDS - start)) "$label")")
}
report_timings() {
  if [ "${#timings[@]}" -gt 0 ]; then
    printf '\n== timings\n'
    printf '%s\n' "${timings[@]}"
  fi
}

# ---------------------------------------------------------------- cleanup
service_pid=""
ticker_pid=""
cleanup() {
  local rc=$?
  set +e
  if [ "$rc" -ne 0 ]; then
    echo "check-containers: failed; logs of what ran:" >&2
    for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep -E "^($run_prefix|${compose_project}_)"); do
      echo "--- podman logs $c (last 40 lines)" >&2
      podman logs --tail 40 "$c" >&2 2>&1
    done
  fi
  [ -n "$ticker_pid" ] && kill "$ticker_pid" 2>/dev/null && wait "$ticker_pid" 2>/dev/null
  if [ -n "${compose_ready:-}" ]; then
    compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1
  fi
  remove_run_objects
  [ -n "$service_pid" ] && kill "$service_pid" 2>/dev/null && wait "$service_pid" 2>/dev/null
  report_timings
  exit "$rc"
}
trap cleanup EXIT

remove_run_objects() {
  local c
  for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep -E "^$run_prefix-"); do
    podman rm -f -v -t 0 "$c" >/dev/null 2>&1
  done
  podman network rm -f "$run_prefix-net" >/dev/null 2>&1 || true
  podman volume rm -f "$run_prefix-pgdata" >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------- 1. tools
install_tools() {
  # netavark (podman's network backend) runs iptables to set up every
  # container's network: without it each `podman run` and `RUN` step fails
  # with "netavark: No such file or directory", and --no-install-recommends
  # does not bring it.
  local wanted=(podman runc debootstrap docker-compose netavark aardvark-dns catatonit iptables) missing=() pkg
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing from Debian: ${missing[*]}"
    # Another apt-get may hold the lock on a shared machine: wait for it.
    apt-get -o DPkg::Lock::Timeout=600 update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
      --no-install-recommends "${missing[@]}"
  fi
  mkdir -p "$cache"
  # crun, podman's default runtime, fails on this kind of machine's cgroups
  # (v1, no systemd); runc with the cgroupfs manager works. Ulimits are
  # left as they are (the defaults exceed what the machine allows).
  cat >"$cache/containers.conf" <<'EOF'
[containers]
default_ulimits = []
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
EOF
  export CONTAINERS_CONF="$cache/containers.conf"
  podman --version
  docker-compose version --short
}

# ---------------------------------------------------------------- 2. base images
# The digest stored in an image's label, or nothing when the image is absent.
image_inputs() { podman image inspect --format "{{index .Labels \"$inputs_label\"}}" "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1"; }
digest() { sha256sum | cut -c1-16; }

base_image="$local_prefix/debian:$debian_release-slim"
builder_image="$local_prefix/rust:slim-$debian_release"

make_base_image() {
  local key
  key="$(printf 'debootstrap --variant=minbase %s %s v1' "$debian_release" "$debian_mirror" | digest)"
  if [ "$(image_inputs "$base_image")" = "$key" ]; then
    echo "$base_image is current ($key)"
    return
  fi
  echo "making $base_image with debootstrap (minbase $debian_release)"
  local rootfs="$cache/rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase "$debian_release" "$rootfs" "$debian_mirror" >"$cache/debootstrap.log" 2>&1 ||
    fail "debootstrap failed; see $cache/debootstrap.log"
  # As the official slim image: no package lists, no apt cache.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
  tar -C "$rootfs" -c . | podman import \
    --change 'CMD ["bash"]' \
    --change "LABEL $inputs_label=$key" \
    - "$base_image" >/dev/null
  rm -rf "$rootfs"
}

# The machine's toolchain, its certificate authorities and the Containerfile
# make the builder stand-in; the copy (about 1 GB) is made only when one of
# them changed.
make_builder_image() {
  local sysroot key context
  sysroot="$(readlink -f "$(rustc --print sysroot)")"
  key="$({
    image_id "$base_image"
    rustc -vV
    cat infra/stand-ins/rust/Containerfile
    cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true
  } | digest)"
  if [ "$(image_inputs "$builder_image")" = "$key" ]; then
    echo "$builder_image is current ($key: $(rustc --version))"
    return
  fi
  echo "making $builder_image from $sysroot ($(rustc --version))"
  context="$cache/builder-context"
  rm -rf "$context" && mkdir -p "$context/toolchain" "$context/ca"
  cp infra/stand-ins/rust/Containerfile "$context/"
  # Documentation and other targets' libraries are not needed to build.
  tar -C "$sysroot" --exclude=./share/doc --exclude='./lib/rustlib/aarch64-*' -c . | tar -C "$context/toolchain" -x
  cp /usr/local/share/ca-certificates/*.crt "$context/ca/" 2>/dev/null || true
  podman build -q --format docker --pull=never --build-arg "BASE_IMAGE=$base_image" \
    --label "$inputs_label=$key" -t "$builder_image" "$context" >/dev/null
  rm -rf "$context"
}

# A stand-in for an image the compose file names, tagged with that exact name.
make_stand_in() {
  local name="$1" tag="$2" key
  key="$({
    image_id "$base_image"
    tar -C "infra/stand-ins/$name" --sort=name --mtime=@0 --owner=0 --group=0 -c .
  } | digest)"
  if [ "$(image_inputs "$tag")" = "$key" ]; then
    echo "$tag is current ($key)"
    return
  fi
  echo "making $tag from infra/stand-ins/$name"
  podman build -q --format docker --pull=never --build-arg "BASE_IMAGE=$base_image" \
    --label "$inputs_label=$key" -t "$tag" "infra/stand-ins/$name" >/dev/null
}

# The images infra/docker-compose.yml names, as podman spells them.
compose_image() {
  local service="$1"
  awk -v s="  $service:" '$0 == s {f=1; next} f && /^  [a-z]/ {exit} f && $1 == "image:" {print $2; exit}' infra/docker-compose.yml
}

make_images() {
  make_base_image
  make_builder_image
  local service image
  for service in postgres redis worker; do
    image="$(compose_image "$service")"
    [ -n "$image" ] || fail "no image for the service $service in infra/docker-compose.yml"
    case "$service" in
      worker) make_stand_in python "docker.io/library/$image" ;;
      *) make_stand_in "$service" "docker.io/library/$image" ;;
    esac
  done
}

# ---------------------------------------------------------------- 3. the coordinator image
build_coordinator() {
  podman build --format docker --pull=never -f infra/Dockerfile \
    --build-arg "BUILDER_IMAGE=$builder_image" \
    --build-arg "RUNTIME_IMAGE=$base_image" \
    -t "$coordinator_image" . || fail "infra/Dockerfile did not build"
  # The compose file's name for it.
  podman tag "$coordinator_image" "localhost/$(compose_image coordinator)"
  local bytes
  bytes="$(podman image inspect --format '{{.Size}}' "$coordinator_image")"
  image_size="$((bytes / 1024 / 1024)) MiB"
  echo "image $coordinator_image: $image_size"
}

# ---------------------------------------------------------------- helpers
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# until SECONDS DESCRIPTION COMMAND...: retries COMMAND every half second.
until_true() {
  local limit="$1" what="$2" deadline=$((SECONDS + $1))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what: not within ${limit} s"
    sleep 0.5
  done
}

producer_key=dev-producer-key-0001
worker_key=dev-worker-key-00001
admin_key=dev-admin-key-000001
api_keys="producer:$producer_key,worker:$worker_key,admin:$admin_key"
secret=dev-secret-change-me-0123456789abcdef

ready() { curl -fsS "http://127.0.0.1:$1/readyz" | grep -q '"status":"ready"'; }
redis_ok() { curl -fsS "http://127.0.0.1:$1/readyz" | grep -q '"redis":"ok"'; }

# enqueue PORT PAYLOAD: prints the job id.
enqueue() {
  curl -fsS -X POST "http://127.0.0.1:$1/v1/jobs" -H "Authorization: Bearer $producer_key" \
    -H 'Content-Type: application/json' -d "{\"queue\": \"default\", \"payload\": $2}" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
job_state() {
  curl -fsS "http://127.0.0.1:$1/v1/jobs/$2" -H "Authorization: Bearer $admin_key" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])'
}
job_is() { [ "$(job_state "$1" "$2")" = "$3" ]; }

# The compose file's stop grace period of a service, in seconds.
stop_grace() {
  awk -v s="  $1:" '$0 == s {f=1; next} f && /^  [a-z]/ {exit} f && $1 == "stop_grace_period:" {print $2; exit}' infra/docker-compose.yml |
    sed 's/s$//'
}

# stop_within NAME SECONDS: SIGTERM (the image's STOPSIGNAL), then the time
# to exit must stay below SECONDS and the exit code must be 0 (a SIGKILL
# after the grace period gives 137).
stop_within() {
  local name="$1" grace="$2" start code elapsed
  start="$(date +%s.%N)"
  podman stop -t "$grace" "$name" >/dev/null
  elapsed="$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")"
  code="$(podman inspect --format '{{.State.ExitCode}}' "$name")"
  echo "$name: SIGTERM to exit in $elapsed s (grace $grace s), exit code $code"
  [ "$code" = 0 ] || fail "$name exited with $code after SIGTERM (137: killed when the grace ran out)"
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$elapsed" "$grace" ||
    fail "$name took $elapsed s to drain, not within its stop grace period of $grace s"
}

# ---------------------------------------------------------------- 4. the image run
run_image() {
  remove_run_objects
  local net="$run_prefix-net" pg="$run_prefix-postgres" redis="$run_prefix-redis"
  local coord="$run_prefix-coordinator" worker="$run_prefix-worker" port password=ci-password
  podman network create "$net" >/dev/null
  podman run -d --name "$pg" --network "$net" -v "$run_prefix-pgdata:/var/lib/postgresql/data" \
    -e POSTGRES_PASSWORD="$password" -e POSTGRES_DB=runlease "docker.io/library/$(compose_image postgres)" >/dev/null
  podman run -d --name "$redis" --network "$net" "docker.io/library/$(compose_image redis)" \
    redis-server --save "" --appendonly no >/dev/null
  until_true 60 "PostgreSQL ready in $pg" podman exec "$pg" pg_isready -h 127.0.0.1 -U postgres -d runlease
  until_true 30 "Redis answering in $redis" podman exec "$redis" redis-cli ping

  port="$(free_port)"
  podman run -d --name "$coord" --network "$net" -p "127.0.0.1:$port:8080" \
    -e "RUNLEASE_DATABASE_URL=postgres://postgres:$password@$pg:5432/runlease" \
    -e "RUNLEASE_REDIS_URL=redis://$redis:6379" \
    -e "RUNLEASE_API_KEYS=$api_keys" -e "RUNLEASE_SECRET=$secret" \
    "$coordinator_image" >/dev/null
  until_true 60 "/readyz ready on the published port $port" ready "$port"
  # Ready means PostgreSQL and the migrations; the Redis subscription comes
  # up beside them and /readyz says "degraded" until it has, so wait for it.
  until_true 30 "/readyz reporting Redis ok" redis_ok "$port"
  echo "readyz: $(curl -fsS "http://127.0.0.1:$port/readyz")"

  local applied expected
  applied="$(podman exec "$pg" psql -U postgres -d runlease -Atc 'SELECT count(*) FROM runlease_migrations')"
  expected="$(find migrations -name '[0-9]*.sql' | wc -l)"
  echo "migrations applied: $applied of $expected"
  [ "$applied" = "$expected" ] || fail "$applied migrations applied, $expected in migrations/"

  podman healthcheck run "$coord" >/dev/null || fail "the image's HEALTHCHECK failed in $coord"
  echo "health check: $(podman inspect --format '{{.State.Health.Status}}' "$coord")"
  [ "$(podman inspect --format '{{.State.Health.Status}}' "$coord")" = healthy ] || fail "$coord is not healthy"

  local uid pid1_uid
  uid="$(podman exec "$coord" id -u)"
  pid1_uid="$(podman exec "$coord" awk '/^Uid:/ {print $2}' /proc/1/status)"
  echo "uid: id -u = $uid, the coordinator process (pid 1) = $pid1_uid"
  if [ "$uid" != 10001 ] || [ "$pid1_uid" != 10001 ]; then
    fail "the coordinator runs as uid $pid1_uid (id -u: $uid), not 10001"
  fi

  # The example worker as the compose file runs it: its image, its command,
  # its user, the coordinator by name on the container network.
  podman run -d --name "$worker" --network "$net" --user 65534:65534 \
    -v "$repo/examples/plain_http/python_worker.py:/app/python_worker.py:ro" \
    -e "RUNLEASE_URL=http://$coord:8080" -e "RUNLEASE_KEY=$worker_key" -e PYTHONUNBUFFERED=1 \
    "docker.io/library/$(compose_image worker)" \
    python3 /app/python_worker.py --queue default --concurrency 4 >/dev/null
  local job
  job="$(enqueue "$port" '{"sleep_ms": 300}')"
  until_true 60 "job $job completed by the worker's container" job_is "$port" "$job" "done"
  echo "job $job: done, by $worker"

  # Drains: the worker with a job in hand (it finishes it within its
  # grace), then the coordinator (its long-polls end, it exits 0).
  job="$(enqueue "$port" '{"sleep_ms": 2000}')"
  until_true 30 "job $job running" job_is "$port" "$job" running
  stop_within "$worker" "$(stop_grace worker)"
  local state
  state="$(job_state "$port" "$job")"
  echo "job $job after the worker's drain: $state"
  [ "$state" = "done" ] || [ "$state" = queued ] || fail "job $job is $state after the worker drained"
  stop_within "$coord" "$(stop_grace coordinator)"
  [[ "$(podman logs "$coord" 2>&1)" == *'shutdown signal received: draining'* ]] || fail "$coord did not log its drain"
  remove_run_objects
}

# ---------------------------------------------------------------- 5. compose
compose_ready=""
compose() { docker-compose -f infra/docker-compose.yml -p "$compose_project" "$@"; }

# podman runs health checks from systemd timers; without systemd nothing runs
# them, so this loop does, every two seconds, for the project's containers.
health_ticker() {
  while :; do
    for c in $(podman ps -q --filter "label=com.docker.compose.project=$compose_project" 2>/dev/null); do
      podman healthcheck run "$c" >/dev/null 2>&1 || true
    done
    sleep 2
  done
}

# The project's containers, networks and volumes (named ones by their label,
# anonymous ones as those that were not there before `up`).
volumes_before=""
project_objects() {
  podman ps -a --filter "label=com.docker.compose.project=$compose_project" --format 'container {{.Names}}'
  podman network ls --format '{{.Name}}' | sed -n "s/^\(${compose_project}_.*\)/network \1/p"
  comm -13 <(printf '%s\n' "$volumes_before" | sort) <(podman volume ls -q | sort) | sed 's/^/volume /'
}

run_compose() {
  local sock="$cache/podman.sock" port
  rm -f "$sock"
  podman system service --time=0 "unix://$sock" >"$cache/podman-service.log" 2>&1 &
  service_pid=$!
  export DOCKER_HOST="unix://$sock"
  until_true 30 "podman's Docker-compatible socket" curl -fsS --unix-socket "$sock" http://d/_ping
  health_ticker &
  ticker_pid=$!

  # What an interrupted run left.
  [ -z "$(podman ps -aq --filter "label=com.docker.compose.project=$compose_project")" ] ||
    compose down -v --remove-orphans --timeout 5
  volumes_before="$(podman volume ls -q)"
  port="$(free_port)"
  export RUNLEASE_HTTP_PORT="$port"
  compose_ready=1
  # `up` waits for PostgreSQL and Redis to be healthy before it starts the
  # coordinator, and for the coordinator before the worker.
  timeout 300 docker-compose -f infra/docker-compose.yml -p "$compose_project" up -d ||
    fail "docker-compose up did not finish"
  compose ps
  until_true 60 "/readyz on the compose file's published port $port" ready "$port"

  local job
  job="$(enqueue "$port" '{"sleep_ms": 300}')"
  until_true 60 "job $job completed by the compose file's worker" job_is "$port" "$job" "done"
  echo "job $job: done, by the compose file's worker"
  [[ "$(compose logs --no-color worker)" == *"$job"* ]] || fail "the worker's log does not mention job $job"

  local start=$SECONDS
  compose down -v
  echo "down -v: $((SECONDS - start)) s"
  compose_ready=""
  local left
  left="$(project_objects)"
  [ -z "$left" ] || fail "left after down -v: $left"
  echo "after down -v: none of the project's containers, volumes or networks"
  kill "$ticker_pid"
  wait "$ticker_pid" 2>/dev/null || true
  ticker_pid=""
}

# Steps to run: all by default; naming some (tools images build run compose)
# runs only those, for work on one of them (the later ones need the images
# of the earlier ones to exist).
read -r -a steps <<<"${*:-tools images build run compose}"
wants() { [[ " ${steps[*]} " == *" $1 "* ]]; }
wants tools || install_tools >/dev/null
wants tools && timed "tools: podman, runc, debootstrap, docker-compose" install_tools
wants images && timed "base images: Debian $debian_release (debootstrap), the Rust builder, the compose file's images" make_images
wants build && timed "build infra/Dockerfile" build_coordinator
wants run && timed "run the image: PostgreSQL, Redis, readiness, health check, uid, a job, drains" run_image
wants compose && timed "compose: infra/docker-compose.yml up, a job, down -v" run_compose
echo
echo "containers: all checks passed${image_size:+ (image $image_size)}"
