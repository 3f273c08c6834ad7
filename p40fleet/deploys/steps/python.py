"""Python layer: training user, Miniconda, conda env, torch, Apex (built once), verl — idempotent.

    pyinfra -y inventories/sim.py deploy/python.py

Runs after deploy/system.py. Everything under the training user's home runs as that user
(``_su_user``). A second run reports no changes; changing the verl ref re-runs only the verl
steps; Apex is compiled on one host per build key (``operations/run/apex_fleet.py`` elects it) and
installed from that wheel everywhere. A host this layer cannot serve (its GPUs, a verl ref
without rules for them, a conda, torch or verl lock that cannot install) is refused by the
preflight before any step; each step below computes what only it needs.
"""

from __future__ import annotations

from pyinfra import host, state

from p40fleet import apex_build, preflight, verl_patches
from p40fleet.deploys.steps import preflight as preflight_steps
from p40fleet.facts.env import env_dir, env_python
from p40fleet.facts.gpu import PciGpus
from p40fleet.facts.host import Cpus, MemTotal
from p40fleet.facts.survey import ask
from p40fleet.operations import apex, artifacts, conda, torch, training_user, verl
from p40fleet.operations.run import apex_fleet
from p40fleet.operations.run.spec import validated_spec
from p40fleet.paths import FILES
from p40fleet.privdrop import STAGE_DIR
from p40fleet.runtime.included import included


def run() -> None:
    """The deploy's steps for the current host (``deploy/python.py`` calls it)."""
    # Refusals first (OS, GPUs, verl ref, locks, space, mirror), also when this deploy runs alone;
    # idempotent. A refused host gets no step (validated_spec returns None for it). The steps run
    # at the file's top level, as in deploy/system.py.
    with included("deploy/preflight.py"):
        preflight_steps.run()
    spec = validated_spec()

    if spec is None:
        return

    user, env = spec.user, spec.env
    force = set(spec.policy.force_reinstall)
    # Commands run as the training user (su); facts run as root and drop to that user for
    # anything under its home (p40fleet/privdrop.py), answering "missing" while it does not
    # exist yet (a fresh host: facts are gathered before the user is created).
    as_user = {"user": user.name}
    python = env_python(env.conda_prefix, env.name)
    the_env = env_dir(env.conda_prefix, env.name)
    mirror_channel = spec.mirror.conda_channel if spec.mirror is not None else None
    variant = spec.requirements_variant
    # The env (re)created in this run: what the facts saw installed in it no longer holds.
    fresh = conda.env_fresh(
        env.conda_prefix, env.name, spec.python_version, user.name, force="env" in force,
        lock_sum=preflight.conda_lock_sum(spec),  # the lock the preflight checked
    )  # fmt: skip

    # 1. Training user: fixed uid, so a reinstalled OS gets the same owner for the kept /home.
    training_user.queued_hosts(state).add(host.name)
    training_user.training_user(
        name=f"Training user {user.name} (uid {user.uid})",
        user=user.name,
        uid=user.uid,
        home=user.home,
    )

    training_user.directory(
        name=f"Training data dir {env.data_dir}", path=env.data_dir, user=user.name,
        group=user.name, mode="750",
    )  # fmt: skip
    training_user.directory(
        name=f"Model dir {env.model_dir}", path=env.model_dir, user=user.name,
        group=user.name, mode="750",
    )  # fmt: skip

    # 2. Miniconda from the sha256-verified installer; ToS per policy.
    artifacts.artifact(name=f"Fetch {spec.miniconda.filename}", item="miniconda", spec=spec)
    conda.miniconda(
        name=f"Miniconda {spec.miniconda.version} in {env.conda_prefix}",
        installer=artifacts.artifact_path(spec, "miniconda"),
        prefix=env.conda_prefix,
        force="miniconda" in force,
        **as_user,
    )
    if mirror_channel:
        conda.condarc(
            name=f"{env.conda_prefix}/.condarc: the mirror channel only",
            prefix=env.conda_prefix,
            channel=mirror_channel,
            **as_user,
        )
    conda.conda_tos(
        name="Anaconda ToS (policy.conda_tos)",
        prefix=env.conda_prefix,
        policy=spec.policy.conda_tos,
        mirror_channel=mirror_channel,
        proxy=spec.proxy,
        **as_user,
    )

    # 3. The env, from the explicit conda lock (each file's sha256 checked by conda): kept while
    # its python runs at the pin and it records this lock, else removed and created again.
    conda.env(
        name=f"Conda env {env.name} (python {spec.python_version})",
        prefix=env.conda_prefix,
        env_name=env.name,
        python_version=spec.python_version,
        lock=str(preflight.conda_lock_path(spec)),  # the file the preflight checked
        # root-owned, outside the home (as the torch lock): the user's conda only reads it
        lock_dest=f"{spec.paths.artifact_cache}/conda-env-{variant}.txt",
        lock_channel=mirror_channel,
        channels=conda.channel_args(spec.policy.conda_tos, mirror_channel),
        force="env" in force,
        proxy=spec.proxy,
        **as_user,
    )

    # 4. torch trio and its closure from the variant's hash-locked file (--require-hashes).
    torch.torch(
        name=f"torch {spec.torch.version}",
        python=python,
        version=spec.torch.version,
        torchvision=spec.torch.torchvision,
        torchaudio=spec.torch.torchaudio,
        lock=str(preflight.torch_lock_path(spec)),  # the file the preflight checked
        # root-owned (the artifact cache): the training user cannot edit it before pip reads it,
        # and no root-owned dir appears under its home (its Apex build mkdirs ~/.cache/p40fleet)
        lock_dest=f"{spec.paths.artifact_cache}/torch-requirements-{variant}.txt",
        sha256=spec.torch.sha256.given(),
        index_args=spec.pip_index_args(),
        fresh_env=fresh,
        force="torch" in force,
        proxy=spec.proxy,
        **as_user,
    )

    # 5. Apex: one build per key and fleet (the builder), a wheel for everyone.
    # The same three operations on every host, so pyinfra orders them alike everywhere:
    # the builder's build and copy-back happen before anyone's upload.
    build = spec.apex_build(ask(host, PciGpus))
    key = build.key
    host_tar = f"{apex_build.host_work_dir(user.home, key)}/{apex_build.WHEEL_TAR}"
    local_tar = apex_build.controller_wheel(key)
    wheel_sum = apex_build.host_sum(spec.paths.artifact_cache, key)  # root-owned
    needed = apex.needed(python, the_env, key, user.name, fresh_env=fresh, force="apex" in force)
    builder = apex_fleet.builder(state, key) if needed else None
    builds_here = builder == host.name
    apex.build_wheel(
        name="Build the Apex wheel (one host per build key)",
        python=python,
        env_dir=the_env,
        remote=spec.git_remote("apex"),
        ref=spec.apex.ref,
        commit=spec.apex.commit,
        key=key,
        cuda_home=spec.paths.cuda_dir,
        arch_list=build.arch_list,
        max_jobs=apex_build.max_jobs(ask(host, Cpus), ask(host, MemTotal)),
        cuda_ext=build.cuda_ext,
        needed=builds_here,
        proxy=spec.proxy,
        user=user.name,
    )
    apex.fetch_wheel(
        name="Copy the Apex wheel to the controller cache",
        remote_tar=apex_build.built_tar(STAGE_DIR, key),  # root's copy, root's sum (S8)
        local_tar=local_tar,
        needed=builds_here,
    )
    apex.put_wheel(
        name="Upload the Apex wheel from the controller cache",
        local_tar=local_tar,
        remote_tar=host_tar,
        user=user.name,
        builder=builder,
        needed=needed,  # the builder too: its wheel was built outside the user's home
    )
    apex.put_sum(
        name="Upload the Apex wheel's recorded sha256",
        local_tar=local_tar,
        remote_sum=wheel_sum,
        needed=needed,
    )
    apex.install(
        name=f"Apex {spec.apex.ref} ({key})",
        python=python,
        wheel_tar=host_tar,
        key=key,
        env_dir=the_env,
        verify=build.verify_code,
        sha256_file=wheel_sum,
        fresh_env=fresh,
        force="apex" in force,
        **as_user,
    )

    # 6. verl: pinned checkout, patched for this host's profile, deps pinned, --no-deps -e.
    moving = verl.checkout_moves(env.verl_checkout, spec.verl.commit, user.name)
    profile = spec.gpu_summary(ask(host, PciGpus)).profile
    cache = f"{user.home}/.cache/p40fleet"
    verl.checkout(
        name=f"verl checkout at {spec.verl.ref}",
        path=env.verl_checkout,
        remote=spec.git_remote("verl"),
        ref=spec.verl.ref,
        commit=spec.verl.commit,
        proxy=spec.proxy,
        **as_user,
    )
    verl.patch(
        name=f"verl patch rules ({profile})",
        python=python,
        checkout=env.verl_checkout,
        script_src=str(FILES / "verl_patches.py"),
        rules_json=verl_patches.ruleset_json(spec.verl.ref, profile),
        work_dir=f"{cache}/verl-patch",
        checkout_changes=moving,
        **as_user,
    )
    verl.requirements(
        name=f"verl pinned deps ({variant})",
        python=python,
        src=str(preflight.verl_requirements_path(spec)),  # the file the preflight checked
        dest=f"{cache}/verl-requirements-{variant}.txt",
        env_dir=the_env,
        index_args=spec.pip_deps_args(),
        fresh_env=fresh,
        proxy=spec.proxy,
        **as_user,
    )
    verl.install(
        name=f"verl {spec.verl.version} (editable, --no-deps)",
        python=python,
        checkout=env.verl_checkout,
        version=spec.verl.version,
        fresh_env=fresh,
        checkout_changes=moving,
        force="verl" in force,
        **as_user,
    )
