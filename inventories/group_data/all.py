"""Group data for every host: the stack spec's lab-wide settings.

pyinfra loads this file for any inventory in ``inventories/`` (every host is in group ``all``).
The data key ``stack`` is validated by ``p40fleet/spec/`` at the top of every deploy; a host
with a bad value is refused (with the field, the value and what is expected) and left untouched,
the other hosts carry on.

Only what a lab usually changes is set here. Everything left out takes the default from
``p40fleet/spec/pins.py``, and **those defaults are the real pins** (docs/stack-facts.md §1):
driver 525.147.05, CUDA 11.8.0, cuDNN 8.9.7.29, Miniconda py310_24.11.1-0, Python 3.10.12, torch
2.6.0+cu118, Apex 25.09, verl v0.5.0 — each downloaded file with its published sha256. Don't
copy the pins in here "to be explicit": a copy goes stale when the defaults are updated.

Per-host changes go in the inventory as ``stack_host`` (deep-merged over ``stack``), not by
setting ``stack`` on a host: a host-level ``stack`` *replaces* this whole dict.

No secrets here (this file is committed). Keys/passwords belong in ssh-agent or ~/.ssh/config.
"""

# Only `stack` is host data; anything else defined here would become host data too.
__all__ = ["stack"]

stack = {
    # --- policy: what the deploy may do on its own ---------------------------------------------
    "policy": {
        # The driver install needs nouveau gone: blacklist + initramfs + a reboot. With False the
        # deploy prepares everything, then stops the host with "reboot needed" and you reboot it
        # yourself (e.g. after draining jobs); run the deploy again afterwards. True: the deploy
        # reboots the host itself and waits for it.
        "allow_reboot": False,
        # "conda-forge": create the env from conda-forge only (no Terms of Service). "accept":
        # Anaconda's default channels pkgs/main and pkgs/r; their ToS is accepted where the
        # installed conda checks it (the conda-anaconda-tos plugin, Miniconda >= 25.5.1; the
        # pinned 24.11.1 has none). Anaconda's terms limit free use of those channels by
        # organisations of more than 200 people: check yours may before choosing "accept".
        "conda_tos": "conda-forge",
        # Components to reinstall even when the right version is present, e.g. ["apex"] after a
        # broken build. Names: driver, cuda, cudnn, miniconda, env, torch, apex, verl.
        "force_reinstall": [],
        # CUDA 11.8's installer refuses gcc > 11; True passes --override (builds may then fail).
        "allow_gcc_override": False,
        # Maxwell (M40/M60) is refused by default; True installs the stack there anyway.
        "allow_maxwell": False,
        # A plain-http mirror.conda_channel is refused; True accepts it (the env's packages are
        # still checked against the conda lock's sha256, but anyone on the path can stall it).
        "allow_http_conda_channel": False,
    },
    # --- user: the account that runs training ---------------------------------------------------
    # Defaults: name "verl", uid 2001, home /home/verl. Keep the uid the same on every host
    # (shared filesystems); the conda env, the verl checkout, data and models live under home
    # so they survive an OS reinstall that keeps /home.
    # "user": {"name": "verl", "uid": 2001, "home": "/home/verl"},
    #
    # --- mirror: a local mirror for an air-gapped lab --------------------------------------------
    # Unset = download from NVIDIA / Anaconda / download.pytorch.org / GitHub. Every file is still
    # checked against its sha256 (the mirror is not trusted more than upstream): artifacts
    # against stack.<artifact>.sha256, wheels against the files/*-requirements-*.txt locks, the
    # conda env's packages against files/conda-env-<variant>.txt, git checkouts by commit.
    # "mirror": {
    #     "artifacts_url": "http://192.0.2.1:8111/artifacts",   # + "/<filename>"
    #     "pip_index_url": "http://192.0.2.1:8111/simple",      # PEP 503 index, or None
    #     "pip_find_links": None,                               # wheelhouse URL/dir, or None
    #     "git_base_url": "http://192.0.2.1:8111/git",          # + "/verl.git", "/apex.git"
    #     # apt source, written before any apt install; signed_by = the repo's key on the
    #     # controller ("trusted": True instead turns apt's signature check off, never implied:
    #     # over http the network path then chooses the packages root installs)
    #     "apt": {"url": "http://192.0.2.1:8111/ubuntu", "suite": "focal",
    #             "components": ["main", "universe"], "signed_by": "/srv/keys/mirror.gpg",
    #             "extra_suites": ["focal-updates", "focal-security"]},  # kernel headers there
    #     # conda channel serving the lock's files (files/conda-env-<variant>.txt) under
    #     # "/<subdir>/<file>"; https, or http only with policy.allow_http_conda_channel: True
    #     "conda_channel": "https://mirror.example/conda",
    #     "air_gapped": False,  # True: every source above is required; distro apt sources aside
    #                           # (False again: the deploy moves them back)
    # },
    #
    # --- paths -----------------------------------------------------------------------------------
    # Defaults: CUDA in /usr/local/cuda-11.8 (symlink /usr/local/cuda), cuDNN extracted in
    # /usr/local/src (same filesystem as the CUDA dir: its files are hard-linked; never a tmp dir),
    # downloads cached in /var/cache/p40fleet.
    # "paths": {"artifact_cache": "/var/cache/p40fleet"},
    #
    # --- pins ------------------------------------------------------------------------------------
    # Changing a version means supplying its file name, URL and full sha256 too, e.g. another
    # R525 driver (the spec refuses a new version with the old version's file or sum):
    # "driver": {"version": "525.125.06", "filename": "NVIDIA-Linux-x86_64-525.125.06.run",
    #            "url": "https://us.download.nvidia.com/tesla/525.125.06/NVIDIA-Linux-x86_64-525.125.06.run",
    #            "sha256": "<64 hex characters from NVIDIA>"},
}
