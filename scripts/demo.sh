#!/usr/bin/env bash
# The main job on a fresh clone: builds sequenced, shows the plan of examples/shop, then runs the
# operator for real (`sequenced run`) and deploys the example charts, one step at a time:
#   1. installs examples/shop (layers database and queue, then app) while `sequenced status
#      --watch` draws it, then upgrades it (revision 2 rolls out in the same order);
#   2. installs examples/migrate (its migration Job is a pre-install/pre-upgrade hook), upgrades
#      it with a migration that fails (the end of its log in the status and the HookFailed event),
#      and rolls it back with `sequenced rollback`;
#   3. uninstalls shop (app first, then queue and database);
#   4. prints the hand-off per layer it measured, and leaves nothing running.
#
# Where it deploys, SEQUENCED_DEMO_CLUSTER:
#   auto (default)  the cluster of the current kubeconfig when it answers, else embedded
#   kubeconfig      the cluster of the current kubeconfig (an error when it does not answer)
#   embedded        the project's test API server (tests/support), started for the demo by
#                   `sequenced-demo serve` (a binary of the test support crate, never part of
#                   `sequenced`); it plays the kubelet and the Job controller
# On a cluster it asks for nothing but a namespace of its own, deleted at the end; it installs
# the SequencedRelease CRD only when the cluster lacks it, and then removes it at the end. On a
# cluster without Nodes it plays the kubelet for the Pods of its own namespace, and says so.
#
# Also: SEQUENCED_DEMO_DIR (where the logs go, default target/demo), SEQUENCED_DEMO_PROFILE (the
# cargo profile sequenced is built with, default release), SEQUENCED_DEMO_BIN (a sequenced
# binary to use instead of building one), SEQUENCED_DEMO_PACE (seconds a Pod
# takes to start, and a Job's Pod to finish, where the demo plays the kubelet; default 1),
# SEQUENCED_DEMO_TIMEOUT (seconds each step may take, default 180). Without a terminal on
# stdout it prints each release's status once it is done instead of watching it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"

SEQUENCED_HELM="$(scripts/install-helm.sh)"
export SEQUENCED_HELM

profile="${SEQUENCED_DEMO_PROFILE:-release}"
pace="${SEQUENCED_DEMO_PACE:-1}"
timeout="${SEQUENCED_DEMO_TIMEOUT:-180}"
mode="${SEQUENCED_DEMO_CLUSTER:-auto}"
case "$mode" in
  auto | kubeconfig | embedded) ;;
  *)
    echo "SEQUENCED_DEMO_CLUSTER must be auto, kubeconfig or embedded, not $mode" >&2
    exit 2
    ;;
esac

target="$( (cargo metadata --format-version 1 --no-deps --offline 2>/dev/null || true) |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
target="${target:-$repo/target}"
case "$profile" in
  dev | test) out=debug ;;
  *) out="$profile" ;;
esac
if [ -n "${SEQUENCED_DEMO_BIN:-}" ]; then
  bin="$SEQUENCED_DEMO_BIN"
else
  echo "== building sequenced ($profile)" >&2
  cargo build --profile "$profile" --locked --quiet --bin sequenced
  bin="$target/$out/sequenced"
fi
echo "== building the demo's tools (sequenced-demo, a binary of the test support crate, not of sequenced)" >&2
cargo build --locked --quiet -p sequenced-testkit --bin sequenced-demo
demo="$target/debug/sequenced-demo"

dir="${SEQUENCED_DEMO_DIR:-$target/demo}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
rm -f "$dir"/{kubeconfig,server.url,server.log,operator.log,watch.log,watch.err,crd.yaml,timings.txt}
log="$dir/watch.log"

# Each step starts with one line that says what to look at.
current_step=
step() {
  current_step="$*"
  printf '\n==== %s\n' "$*"
}
say() { printf '%s\n' "$*"; }
fail() {
  say "demo: $*" >&2
  exit 1
}

if [ -t 1 ]; then terminal=1; else terminal=; fi

step "The plan: shop's layers database and queue start at once, app only once both are ready"
"$bin" graph examples/shop
"$bin" lint examples/shop

# What the demo started, for the clean-up: it runs on success, failure and Ctrl-C.
server_pid=
operator_pid=
watch_pid=
namespace=
crd_installed=
# Stops a process the demo started: SIGTERM, then SIGKILL after `$2` seconds.
stop() {
  local pid="$1" grace="$2" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local code=$?
  trap - EXIT INT TERM HUP
  set +e
  step "Cleaning up: nothing of the demo is left running or in the cluster"
  if [ -n "$namespace" ]; then
    "$demo" cleanup "$namespace" ${operator_pid:+"$operator_pid"}
  fi
  if [ -n "$operator_pid" ]; then
    stop "$operator_pid" 20
    say "operator stopped (its log: $dir/operator.log)"
  fi
  if [ -n "$watch_pid" ]; then
    stop "$watch_pid" 5
    say "the demo's watch stopped (its record: $log)"
  fi
  if [ -n "$crd_installed" ]; then
    "$demo" crd remove && say "the SequencedRelease CRD removed (the demo had installed it)"
  fi
  if [ -n "$server_pid" ]; then
    stop "$server_pid" 5
    say "embedded API server stopped"
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if [ "$mode" != embedded ]; then
  if answer="$("$demo" probe)"; then
    mode=kubeconfig
  elif [ "$mode" = kubeconfig ]; then
    fail "SEQUENCED_DEMO_CLUSTER=kubeconfig, but $answer"
  else
    say "No cluster to deploy to: $answer."
    mode=embedded
  fi
fi

if [ "$mode" = embedded ]; then
  "$demo" serve "$dir/kubeconfig" "$pace" >"$dir/server.url" 2>"$dir/server.log" &
  server_pid=$!
  for ((i = 0; i < 300; i++)); do
    [ -s "$dir/kubeconfig" ] && break
    kill -0 "$server_pid" 2>/dev/null || fail "the embedded API server did not start: $(cat "$dir/server.log")"
    sleep 0.1
  done
  [ -s "$dir/kubeconfig" ] || fail "the embedded API server did not start within 30 s"
  export KUBECONFIG="$dir/kubeconfig"
  unset KUBERNETES_SERVICE_HOST KUBERNETES_SERVICE_PORT
  say "Deploying to the embedded API server, $(cat "$dir/server.url"): the project's test API server (tests/support), started for the demo. It plays the kubelet and the Job controller: a Deployment is available ${pace} s after it changed, a Job's Pod runs ${pace} s and succeeds or fails as its \`echo ...; exit N\` command says."
else
  say "Deploying to the cluster of your kubeconfig: $answer."
fi

namespace_name="sequenced-demo-$(printf '%04x%04x' "$RANDOM" "$RANDOM")"
"$demo" namespace "$namespace_name"
namespace="$namespace_name"
say "Everything goes into the namespace $namespace, created for the demo and deleted at the end."

"$bin" crd >"$dir/crd.yaml"
case "$("$demo" crd ensure "$dir/crd.yaml")" in
  installed)
    crd_installed=1
    say "The cluster had no SequencedRelease CRD: installed it (removed at the end)."
    ;;
  *) say "The SequencedRelease CRD is installed already: used as it is." ;;
esac

kubelet_pace=
if [ "$mode" = kubeconfig ] && [ "$("$demo" nodes)" = 0 ]; then
  kubelet_pace="$pace"
  say "This cluster has no Nodes, so no Pod would ever run: the demo plays the kubelet for the Pods of $namespace only (a Deployment's Pod Running ${pace} s after it was created, a Job's Pod Succeeded or Failed as its \`echo ...; exit N\` command says). Only a real kubelet serves a Pod's log: the failed hook's log is missing here."
fi

"$demo" watch "$namespace" "$log" $kubelet_pace 2>"$dir/watch.err" &
watch_pid=$!
for ((i = 0; i < 300; i++)); do
  grep -q '"mark":"watching"' "$log" 2>/dev/null && break
  kill -0 "$watch_pid" 2>/dev/null || fail "the demo's watch did not start: $(cat "$dir/watch.err")"
  sleep 0.1
done

# Whether the operator's /readyz on 127.0.0.1:$1 answers 200 (its caches are synced).
readyz() {
  local answer=
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3
  read -r answer <&3 || true
  exec 3>&-
  case "$answer" in *" 200"*) return 0 ;; *) return 1 ;; esac
}
: >"$dir/operator.log"
"$bin" run --metrics-addr 127.0.0.1:0 --identity "sequenced-demo-$$" 2>>"$dir/operator.log" &
operator_pid=$!
# Its first log line names the port of /readyz.
port=
for ((i = 0; i < 600; i++)); do
  kill -0 "$operator_pid" 2>/dev/null || fail "the operator exited: $(tail -3 "$dir/operator.log")"
  if [ -z "$port" ]; then
    port="$(sed -n 's/.*"metrics":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$dir/operator.log")"
  fi
  if [ -n "$port" ] && readyz "$port"; then break; fi
  sleep 0.1
done
say "The operator runs: $bin run (pid $operator_pid, its log: $dir/operator.log)."

# On a terminal `sequenced status --watch` clears the screen: the step's line is given time to be
# read before, and repeated under the release's last state after.
pause() {
  if [ -n "$terminal" ]; then sleep 2; fi
}

# Follows release $1 until it is Ready (ready) or Failed (failed): on a terminal `sequenced status
# --watch` draws it as it goes; otherwise its status is printed once it got there.
follow() {
  local name="$1" wanted="$2" code=0
  if [ -n "$terminal" ]; then
    "$bin" status "$name" -n "$namespace" --watch || true
    printf '==== %s\n' "$current_step"
  fi
  "$demo" wait "$namespace" "$name" "$wanted" "$timeout" "$operator_pid" || code=$?
  if [ -z "$terminal" ]; then
    "$bin" status "$name" -n "$namespace"
  fi
  [ "$code" = 0 ] || fail "$name did not end $wanted (see above, and $dir/operator.log)"
}

step "Install shop: database and queue start together; app starts only once both are Ready"
pause
"$demo" mark "$log" "install shop"
"$demo" apply "$namespace" shop examples/shop '{}'
follow shop ready
"$demo" timings "$log" "$namespace" shop 1 "install shop" >>"$dir/timings.txt"

step "Upgrade shop to 2 replicas: revision 2 rolls out in the same order, app once database and queue are Ready again"
pause
"$demo" mark "$log" "upgrade shop"
"$demo" apply "$namespace" shop examples/shop '{"replicas": 2}'
follow shop ready
"$demo" timings "$log" "$namespace" shop 2 "upgrade shop" >>"$dir/timings.txt"

step "Install migrate: its migration Job runs as a pre-install hook, before the layers config and app"
pause
"$demo" mark "$log" "install migrate"
"$demo" apply "$namespace" migrate examples/migrate '{}'
follow migrate ready

step "Upgrade migrate with a migration that fails: look at the (pre-upgrade) stage, the end of the Job's log, and the HookFailed event"
pause
"$demo" mark "$log" "upgrade migrate"
"$demo" apply "$namespace" migrate examples/migrate \
  '{"migrationError": "column email of relation users already exists"}'
follow migrate failed
say "The HookFailed event of migrate:"
"$demo" events "$namespace" migrate HookFailed

step "Roll migrate back: revision 3 applies revision 1's plan again, and the release stays there until its spec changes"
"$demo" mark "$log" "rollback migrate"
"$bin" rollback migrate -n "$namespace" --timeout "${timeout}s" ||
  fail "the rollback of migrate failed (see $dir/operator.log)"

step "Uninstall shop: app goes first, queue and database only once app's objects are gone"
"$demo" mark "$log" "uninstall shop"
"$demo" delete "$namespace" shop
"$demo" wait "$namespace" shop gone "$timeout" "$operator_pid" || fail "shop was not uninstalled"
say "The layers of shop as the demo's watch saw their objects go (seconds after the request):"
"$demo" deletions "$log" shop "uninstall shop"
say "The events of the uninstall:"
"$demo" events "$namespace" shop LayerDeleting LayerDeleted

step "Timings: how long each layer waited for its prerequisites (the hand-off)"
say "Measured by the demo's own watch of $namespace: each event is stamped with this machine's clock when it arrives; a hand-off is from the event in which a layer's last prerequisite was ready to the one of the layer's first object."
cat "$dir/timings.txt"
