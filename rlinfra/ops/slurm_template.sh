#!/bin/bash
# Rendered by `rlinfra slurm render` from @@CONFIG@@. Submit with: sbatch @@SCRIPT_NAME@@
@@SBATCH@@
#
# One Ray cluster per allocation: the Ray head on the first node, `ray start --block` on every
# other node, then the driver on this (the first) node. When the driver ends, or any node's Ray
# exits (a node failure), everything started here is torn down and the script exits: with the
# driver's status, or non-zero when a node failed first. Every wait has a deadline.
#
# Environment overrides (for a local dry run; a real allocation needs none of them):
#   RLINFRA_SLURM_NODE_IP     IP for every `ray start` (default: the head's routable address, found
#                             on the head; never a loopback address when there are several nodes)
#   RLINFRA_SLURM_TEMP_DIR    Ray temp dirs go to $RLINFRA_SLURM_TEMP_DIR/nodeRANK (default: Ray's)
#   RLINFRA_SLURM_PORT        the head's GCS port (default @@PORT@@)
#   RLINFRA_SLURM_HEAD_ARGS   extra `ray start` arguments for the head (e.g. --dashboard-port=N)
#   RLINFRA_SLURM_WORKER_ARGS extra `ray start` arguments for the other nodes
#   RLINFRA_SLURM_NODE_TIMEOUT seconds to wait for the head and then for all nodes (default @@NODE_TIMEOUT@@)
#   RLINFRA_SLURM_STOP_GRACE  seconds between SIGTERM and SIGKILL at teardown (default 15,
#                             shortened to fit inside Slurm's KillWait)
#   RLINFRA_SLURM_RAY, RLINFRA_SLURM_PYTHON  the `ray` and `python` to run (default: from PATH)
# Token authentication: RAY_AUTH_MODE defaults to token; without RAY_AUTH_TOKEN or
# RAY_AUTH_TOKEN_PATH a fresh token is made for this allocation. srun passes the environment to
# every node, so the nodes and the driver share it; it never appears on a command line.
# Each node's CPUs: --cpus-per-node when rendered with it, else what Slurm allocated on that node
# (SLURM_JOB_CPUS_PER_NODE), so Ray never advertises the whole host inside a smaller allocation.
# Teardown reaches the Ray nodes through Slurm (`scancel --signal=TERM JOB`: srun itself answers
# SIGTERM by killing its tasks at once), and Ray stops without draining on SIGTERM.
set -uo pipefail
@@SETUP@@
num_nodes=@@NUM_NODES@@
gpus_per_node=@@GPUS_PER_NODE@@
cpus_per_node=@@CPUS_PER_NODE@@
driver=(@@DRIVER@@)

ray_bin=${RLINFRA_SLURM_RAY:-ray}
python_bin=${RLINFRA_SLURM_PYTHON:-python3}
port=${RLINFRA_SLURM_PORT:-@@PORT@@}
node_timeout=${RLINFRA_SLURM_NODE_TIMEOUT:-@@NODE_TIMEOUT@@}
stop_grace=${RLINFRA_SLURM_STOP_GRACE:-15}
read -r -a head_args <<< "${RLINFRA_SLURM_HEAD_ARGS:-}"
read -r -a worker_args <<< "${RLINFRA_SLURM_WORKER_ARGS:-}"

log() { echo "[rlinfra-slurm $(date +%H:%M:%S)] $*" >&2; }

# The CPUs Slurm allocated on each node, in allocation order ("4(x2),2" -> 4 4 2).
slurm_cpus=()
IFS=, read -r -a cpu_groups <<< "${SLURM_JOB_CPUS_PER_NODE:-}"
for group in "${cpu_groups[@]}"; do
    if [[ $group =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
        for ((i = 0; i < BASH_REMATCH[2]; i++)); do slurm_cpus+=("${BASH_REMATCH[1]}"); done
    elif [[ $group =~ ^[0-9]+$ ]]; then
        slurm_cpus+=("$group")
    fi
done
node_cpus() {  # RANK: the node's CPUs, or "auto" when neither the script nor Slurm says
    if [[ $cpus_per_node != auto ]]; then echo "$cpus_per_node"; else echo "${slurm_cpus[$1]:-auto}"; fi
}
step_args() {  # RANK: one task on one node, with the node's CPUs when they are known
    local args=(--nodes=1 --ntasks=1) cpus
    cpus=$(node_cpus "$1")
    [[ $cpus != auto ]] && args+=(--cpus-per-task="$cpus")
    printf '%s\n' "${args[@]}"
}

# Slurm SIGKILLs a cancelled job's processes KillWait seconds after SIGTERM: the teardown's grace
# must end before that, or this script is killed in the middle of it.
kill_wait=$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" {print $3}')
if [[ $kill_wait =~ ^[0-9]+$ ]] && ((stop_grace > kill_wait - 2)); then
    stop_grace=$((kill_wait > 3 ? kill_wait - 2 : 1))
fi

export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} && -z ${RAY_AUTH_TOKEN_PATH:-} ]]; then
    RAY_AUTH_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
    export RAY_AUTH_TOKEN
fi
export RAY_DISABLE_USAGE_STATS=1
# On SIGTERM a Ray node drains for 30 s before stopping by default, longer than any grace here.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}

pids=()        # every background srun (one per node), head first
names=()       # "node RANK (HOST)" for each of them
driver_pid=""

teardown() {
    # SIGTERM the driver and every node at once, SIGKILL whatever still runs stop_grace s later.
    # The nodes' tasks are signalled through Slurm; srun only where there is no Slurm job (or
    # scancel fails), since srun answers SIGTERM by SIGKILLing its tasks.
    trap - EXIT INT TERM HUP
    local alive=() pid waited=0 through_slurm=0
    if ((${#pids[@]})) && [[ -n ${SLURM_JOB_ID:-} ]] && scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null; then
        through_slurm=1
    fi
    for pid in $driver_pid "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            if [[ $pid == "$driver_pid" ]] || ((!through_slurm)); then kill -TERM "$pid" 2>/dev/null; fi
            alive+=("$pid")
        fi
    done
    if ((${#alive[@]})); then
        log "stopping ${#alive[@]} process(es)"
        while ((waited < stop_grace * 10)); do
            local running=0
            for pid in "${alive[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
            ((running)) || break
            sleep 0.1
            waited=$((waited + 1))
        done
        for pid in "${alive[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    fi
    wait 2>/dev/null
}
trap teardown EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM
trap 'exit 129' HUP

# The first node that is no longer running, as "INDEX"; empty when all run.
dead_node() {
    local i
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "$i"
            return
        fi
    done
}

# Run "$@" in the background and wait for it, but give up as soon as any node exits: then
# set failed_node to that node's index and return 1. Otherwise return the command's status.
failed_node=""
wait_watching_nodes() {
    "$@" &
    local waiter=$!
    while kill -0 "$waiter" 2>/dev/null; do
        failed_node=$(dead_node)
        if [[ -n $failed_node ]]; then
            kill -TERM "$waiter" 2>/dev/null
            wait "$waiter" 2>/dev/null
            return 1
        fi
        wait -n 2>/dev/null || sleep 0.2
    done
    wait "$waiter"
}

end_with_failed_node() {  # name the node that exited and exit with its status (never 0)
    local status=0
    wait "${pids[$failed_node]}" 2>/dev/null || status=$?
    log "${names[$failed_node]}: Ray exited (status $status) before the driver finished; ending the allocation"
    exit $((status == 0 ? 1 : status))
}

mapfile -t hosts < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?not inside a Slurm allocation}")
if ((${#hosts[@]} < num_nodes)); then
    log "the allocation has ${#hosts[@]} node(s) but the config needs $num_nodes"
    exit 1
fi
head_host=${hosts[0]}
# The head's address as the other nodes must reach it: the one its route to the network uses,
# else a non-loopback address its hostname resolves to (Debian maps the hostname to 127.0.1.1).
find_address='from rlinfra.ops.slurm import print_node_address; print_node_address()'
mapfile -t probe < <(step_args 0)
head_ip=${RLINFRA_SLURM_NODE_IP:-$(srun "${probe[@]}" --nodelist="$head_host" "$python_bin" -c "$find_address" "$num_nodes")}
if [[ -z $head_ip ]]; then
    log "cannot find an address of $head_host that the other nodes can reach; set RLINFRA_SLURM_NODE_IP"
    exit 1
fi
ray_address="$head_ip:$port"

node_args() {  # RANK: arguments every `ray start` gets
    local args=(--block --labels="rlinfra-node-rank=$1" --disable-usage-stats)
    [[ -n ${RLINFRA_SLURM_NODE_IP:-} ]] && args+=(--node-ip-address="$RLINFRA_SLURM_NODE_IP")
    [[ -n ${RLINFRA_SLURM_TEMP_DIR:-} ]] && args+=(--temp-dir="$RLINFRA_SLURM_TEMP_DIR/node$1")
    [[ $gpus_per_node != auto ]] && args+=(--num-gpus="$gpus_per_node")
    local cpus
    cpus=$(node_cpus "$1")
    [[ $cpus != auto ]] && args+=(--num-cpus="$cpus")
    printf '%s\n' "${args[@]}"
}

log "head: $head_host ($ray_address); $num_nodes node(s): ${hosts[*]:0:num_nodes}"
mapfile -t args < <(node_args 0)
mapfile -t step < <(step_args 0)
srun "${step[@]}" --nodelist="$head_host" \
    "$ray_bin" start --head --port="$port" "${args[@]}" "${head_args[@]}" &
pids+=($!)
names+=("node 0 ($head_host, head)")

# Wait for the GCS port (the head is up enough for nodes to join), then for every node to be in.
wait_for_port='
import socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while True:
    try:
        socket.create_connection((host, port), timeout=2).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"the Ray head did not open {host}:{port} within {timeout:g} s")
        time.sleep(0.5)
'
wait_for_nodes='
import sys, time
import ray
address, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
ray.init(address=address, logging_level="error", log_to_driver=False)
while True:
    alive = sum(1 for node in ray.nodes() if node.get("Alive"))
    if alive >= want:
        break
    if time.monotonic() > deadline:
        sys.exit(f"only {alive} of {want} Ray nodes joined within {timeout:g} s")
    time.sleep(0.5)
ray.shutdown()
'
wait_watching_nodes "$python_bin" -c "$wait_for_port" "$head_ip" "$port" "$node_timeout"
status=$?
[[ -n $failed_node ]] && end_with_failed_node
((status)) && exit "$status"

for ((rank = 1; rank < num_nodes; rank++)); do
    mapfile -t args < <(node_args "$rank")
    mapfile -t step < <(step_args "$rank")
    srun "${step[@]}" --nodelist="${hosts[$rank]}" \
        "$ray_bin" start --address="$ray_address" "${args[@]}" "${worker_args[@]}" &
    pids+=($!)
    names+=("node $rank (${hosts[$rank]})")
done

wait_watching_nodes "$python_bin" -c "$wait_for_nodes" "$ray_address" "$num_nodes" "$node_timeout"
status=$?
[[ -n $failed_node ]] && end_with_failed_node
((status)) && exit "$status"
log "all $num_nodes node(s) are in; running the driver: ${driver[*]}"

# The driver finds the cluster through RAY_ADDRESS (rlinfra's Cluster and ray.init both read it).
RAY_ADDRESS=$ray_address "${driver[@]}" &
driver_pid=$!
while kill -0 "$driver_pid" 2>/dev/null; do
    failed_node=$(dead_node)
    [[ -n $failed_node ]] && end_with_failed_node
    wait -n 2>/dev/null || sleep 0.2
done
wait "$driver_pid"
status=$?
driver_pid=""
log "the driver exited with status $status"
exit "$status"
