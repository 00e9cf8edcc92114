#!/bin/bash
# One node's share of a syncopt SLURM job: syncopt.sbatch starts it through srun, once per node.
# Its node rank is its place in the allocation's node list (SYNCOPT_NODES, the hostfile's order);
# it runs `PYTHON cli.py ARGS... launch.node_rank=RANK` (prints it with SYNCOPT_DRY_RUN=1).
set -euo pipefail
read -r -a nodes <<< "${SYNCOPT_NODES:?set by syncopt.sbatch}"
me=${SLURMD_NODENAME:-$(hostname -s)}
rank=
for i in "${!nodes[@]}"; do [[ ${nodes[$i]} == "$me" ]] && rank=$i; done
if [[ -z $rank ]]; then
  echo "syncopt_node.sh: node $me is not in the job's node list (${nodes[*]})" >&2
  exit 2
fi
cmd=("$@" "launch.node_rank=$rank")
if [[ -n ${SYNCOPT_DRY_RUN:-} ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
