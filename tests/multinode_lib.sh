# Shared by the multi-node tests (sourced): emulated nodes from tools/testbed with host names of
# their own (node0, node1, ... through --hostnames: a UTS namespace per command and an
# /etc/hosts of the testbed's names per namespace), and Open MPI's rsh agent for them.
#
#   mn_skip_unless_testbed           exit 0 with "SKIP: <why>" unless namespaces can be made here
#   mn_up NODES [testbed up options]  testbed mn<pid> with NODES hosts named node<i>; down at exit
#   mn_exec I CMD...                  run CMD as node I
#   mn_rsh_agent FILE                 write an rsh agent that runs "AGENT nodeI CMD" as node I
#   mn_hostfile FILE SLOTS            every node with SLOTS slots
# Needs TESTBED (the testbed script).

: "${TESTBED:?set TESTBED to tools/testbed/testbed}"
TESTBED=$(realpath "$TESTBED")
MN_NAME="mn$$"
MN_NODES=0

mn_skip_unless_testbed() {
  local why
  if ! why=$("$TESTBED" check); then
    echo "SKIP: $why"
    exit 0
  fi
  command -v unshare >/dev/null || { echo "SKIP: unshare (util-linux) is not installed"; exit 0; }
}

mn_up() {
  MN_NODES=$1
  shift
  "$TESTBED" down --stale >/dev/null
  trap '"$TESTBED" down --name "$MN_NAME"' EXIT
  "$TESTBED" up --name "$MN_NAME" --hosts "$MN_NODES" --hostnames node --owner-pid $$ "$@"
}

mn_exec() {
  local i=$1
  shift
  "$TESTBED" exec --name "$MN_NAME" "$i" -- "$@"
}

mn_rsh_agent() {
  cat >"$1" <<AGENT
#!/usr/bin/env bash
# Open MPI's plm_rsh_agent for testbed $MN_NAME: "\$0 nodeI CMD..." runs CMD as node I through
# sh -c, as ssh would.
set -euo pipefail
host=\$1
shift
[[ "\$host" =~ ^node([0-9]+)\$ ]] || { echo "rsh agent: unknown host '\$host'" >&2; exit 1; }
exec "$TESTBED" exec --name "$MN_NAME" "\${BASH_REMATCH[1]}" -- sh -c "\$*"
AGENT
  chmod +x "$1"
}

mn_hostfile() {
  local i
  : >"$1"
  for ((i = 0; i < MN_NODES; i++)); do echo "node$i slots=$2" >>"$1"; done
}

# mpirun across the nodes, run from node 0: the rsh agent starts orted on the others; Open MPI's
# own traffic stays on eth0; LBCC finds its ranks through MPI_Bcast.
mn_mpirun() {
  local agent="$MN_TMP/rsh_agent" hostfile="$MN_TMP/hostfile" np=$1
  shift
  mn_rsh_agent "$agent"
  mn_hostfile "$hostfile" "$(((np + MN_NODES - 1) / MN_NODES))"
  mn_exec 0 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --allow-run-as-root --hostfile "$hostfile" -np "$np" --map-by node \
    --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include eth0 --mca btl tcp,self --mca btl_tcp_if_include eth0 \
    --mca pml ob1 -x UCX_MEM_EVENTS=no ${LBCC_DEBUG:+-x LBCC_DEBUG} "$@"
}
