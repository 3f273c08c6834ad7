"""p40fleet verify --smoke, the cluster's step: the Ray head's helper (embedded in
files/verify-smoke.sh.j2 by p40fleet.verification.smoke_script; runs as the training user).

    cluster.py nodes CONFIG SCRATCH SIM   every planned member an alive node offering the plan's
                                          resources (@@node NAME IP / @@missing NAME WHY), and
                                          the job's runtime env in SCRATCH/job.json
    cluster.py clean CONFIG SCRATCH SIM   SCRATCH removed on every other alive node (@@left NAME
                                          where it could not be)

CONFIG: {"address", "head_host", "members": [[name, address]], "gpus_per_node", "join_s"}.
Exit 0 when it could ask the cluster, 2 when it could not (the error on stderr).
"""

import json
import os
import socket
import sys


def say(*words):
    print(" ".join(str(w).replace("\n", " ") for w in words), flush=True)


#: What the job's workers need besides the node's own env: their caches in the scratch path
#: (never the user's ~/.cache), offline hubs, one thread each.
def job_config(scratch, sim):
    env = {
        "HF_HOME": f"{scratch}/hf",
        "HF_DATASETS_CACHE": f"{scratch}/hf/datasets",
        "XDG_CACHE_HOME": f"{scratch}/cache",
        "TRITON_CACHE_DIR": f"{scratch}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    runtime_env = {"env_vars": env}
    if sim == "yes":  # the lab-cpu copy, to every node (a member's own ~/verl is unpatched)
        runtime_env["py_modules"] = [f"{scratch}/verl/verl"]
    return {"runtime_env": runtime_env}


def join(cfg):
    import ray

    # this host's address as its raylet registered it (the head's), not a guess
    ray.init(
        address=cfg["address"],
        logging_level="ERROR",
        log_to_driver=False,
        _node_ip_address=socket.gethostbyname(cfg["head_host"]),
    )
    return ray


def alive_nodes(ray):
    return {n["NodeManagerAddress"]: n for n in ray.nodes() if n.get("Alive")}


def nodes(cfg, scratch, sim):
    ray = join(cfg)
    alive = alive_nodes(ray)
    want = int(cfg["gpus_per_node"])
    for name, address in cfg["members"]:
        try:
            ip = socket.gethostbyname(address)
        except OSError as exc:
            say("@@missing", name, f"its address {address} does not resolve on the head: {exc}")
            continue
        node = alive.get(ip)
        if node is None:
            say(
                "@@missing",
                name,
                f"{ip} is not an alive node of the Ray cluster at",
                cfg["address"],
                f"(alive: {', '.join(sorted(alive)) or 'none'}): its Ray "
                "member did not join or has stopped",
            )
            continue
        res = node.get("Resources") or {}
        gpus, cpus = res.get("GPU", 0), res.get("cpu", 0)
        if gpus < want or (sim == "yes" and cpus < want):
            offers = f"GPU {gpus:g}" + (f", cpu {cpus:g}" if sim == "yes" else "")
            needs = "GPU and cpu" if sim == "yes" else "GPU"
            say(
                "@@missing",
                name,
                f"its Ray node offers {offers}; the plan needs {want} {needs}"
                " per node (a unit from before this plan, or Ray does not see the GPUs)",
            )
            continue
        say("@@node", name, ip)
    with open(os.path.join(scratch, "job.json"), "w") as handle:
        json.dump(job_config(scratch, sim), handle)
    ray.shutdown()


def _remove(path):
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)


def clean(cfg, scratch):
    ray = join(cfg)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = socket.gethostbyname(cfg["head_host"])
    names = {}
    for name, address in cfg["members"]:
        try:
            names[socket.gethostbyname(address)] = name
        except OSError:
            pass
    task = ray.remote(_remove)
    refs = {}
    for ip, node in alive_nodes(ray).items():
        if ip == here:  # the head: the script removes its own
            continue
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        refs[names.get(ip, ip)] = task.options(
            num_cpus=0, max_retries=0, scheduling_strategy=strategy
        ).remote(scratch)
    if not refs:
        ray.shutdown()
        return
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=cfg["join_s"])
    for name, ref in refs.items():
        try:
            removed = ref in ready and ray.get(ref)
        except Exception:  # noqa: BLE001 - a node that cannot answer keeps its path
            removed = False
        if not removed:
            say("@@left", name)
    ray.shutdown()


def main():
    mode, config, scratch, sim = sys.argv[1:5]
    cfg = json.load(open(config))
    try:
        if mode == "nodes":
            nodes(cfg, scratch, sim)
        else:
            clean(cfg, scratch)
    except Exception as exc:  # noqa: BLE001 - the cluster could not be asked: say why
        print(
            f"cannot ask the Ray cluster at {cfg['address']}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        sys.exit(2)


main()
