"""The torchrun environment contract, computed for every rank of one attempt (pure).

A script written for ``torchrun`` reads some subset of these variables (``init_process_group``
with ``env://`` reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; most scripts also read
LOCAL_RANK; Accelerate and Lightning read LOCAL_WORLD_SIZE and GROUP_RANK), so every one that
torchrun 2.x sets is set, with torchrun's meaning:

* RANK / WORLD_SIZE: the planner's rank order over all ranks;
* LOCAL_RANK / LOCAL_WORLD_SIZE: the rank's index among the ranks on its node, and their count;
* GROUP_RANK / GROUP_WORLD_SIZE: the node's index (nodes in order of their lowest rank), and the
  number of nodes - torchrun's "agent" is one per node;
* ROLE_NAME / ROLE_RANK / ROLE_WORLD_SIZE: one role, ``default``, as torchrun's;
* MASTER_ADDR / MASTER_PORT: rank 0's node and a port free there, new for every attempt (the
  script's ``init_process_group`` creates a fresh TCPStore on it, so a restarted group never
  meets a stale store - the gloo re-rendezvous trap of pytorch#135712 needs a shared store);
* TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_MAX_RESTARTS / TORCHELASTIC_RUN_ID;
  TORCHELASTIC_USE_AGENT_STORE is ``False``: there is no agent store to join;
* OMP_NUM_THREADS: torchrun's rule - 1 when several ranks share a node and the user set none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def torchrun_env(
    node_of_rank: Sequence[str],
    master_addr: str,
    master_port: int,
    *,
    run_id: str,
    restart_count: int,
    max_restarts: int,
    user_env: Mapping[str, str] | None = None,
    omp_threads: int = 1,
) -> list[dict[str, str]]:
    """One environment per rank (rank order). ``node_of_rank[r]`` names rank r's node (any
    string that is equal for ranks on one node); ``user_env`` is what the user passed (it wins,
    and an ``OMP_NUM_THREADS`` there is kept); ``omp_threads`` is used for a rank alone on its
    node."""
    user_env = dict(user_env or {})
    world = len(node_of_rank)
    nodes: list[str] = []
    for node in node_of_rank:
        if node not in nodes:
            nodes.append(node)
    per_node = {node: [r for r in range(world) if node_of_rank[r] == node] for node in nodes}
    envs = []
    for rank, node in enumerate(node_of_rank):
        local = per_node[node]
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(local)),
            "GROUP_RANK": str(nodes.index(node)),
            "GROUP_WORLD_SIZE": str(len(nodes)),
            "ROLE_NAME": "default",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "OMP_NUM_THREADS": "1" if len(local) > 1 else str(max(1, omp_threads)),
            "PYTHONUNBUFFERED": "1",
        }
        env.update(user_env)
        envs.append(env)
    return envs


__all__ = ["torchrun_env"]
