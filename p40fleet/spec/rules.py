"""The spec's cross-field rules: what no single field's type can say.

A pin changed without its file, sum or commit; the env paths inside user.home, apart from one
another and from the credentials; root's directories outside that home; ports apart; an
air-gapped mirror that serves everything. Each ``check_*`` takes one validated model of
``pins.py`` (which attaches it with pydantic's ``model_validator(mode="after")``), returns it
when it passes, and raises every problem it finds at once (:class:`fields._Problems`, each
with its own field path; ``errors.py`` words them). Defaults that follow another field (the
home from the user name) stay in ``pins.py``: they are defaults, not checks.

Imports run one way: fields <- rules <- pins (the models are named here for typing only).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from p40fleet.spec.fields import (
    _SYSTEM_DIRS,
    _SYSTEM_TREES,
    _TMP_DIRS,
    HOME_ROOTS,
    Problem,
    _cuda_dir_problem,
    _is_under,
    _Problems,
    _root_dir_problem,
)

if TYPE_CHECKING:  # pins.py imports this module: the models are named for typing only
    from p40fleet.spec.pins import (
        AptMirror,
        Artifact,
        GitPin,
        Mirror,
        Paths,
        RayCluster,
        StackSpec,
        TrainingData,
        TrainingUser,
    )

__all__ = [
    "check_apt_mirror",
    "check_mirror",
    "check_paths",
    "check_ray",
    "check_stack",
    "check_training_data",
    "check_user",
]

# Directories of the home that hold credentials: no env path (written by deploys) goes there.
_CREDENTIAL_DIRS = (".ssh", ".gnupg")


def check_paths(paths: Paths) -> Paths:
    """The CUDA dir and link, the cuDNN tree and the cache: root's, persistent, apart."""
    problems = [
        Problem(("cuda_dir",), paths.cuda_dir, expected)
        for expected in [_cuda_dir_problem(paths.cuda_dir, "a toolkit dir", "/usr/local/cuda-11.8")]
        if expected
    ]
    problems += [
        Problem(("cuda_link",), paths.cuda_link, expected)
        for expected in [_cuda_dir_problem(paths.cuda_link, "a symlink", "/usr/local/cuda")]
        if expected
    ]
    for tmp in _TMP_DIRS:
        if _is_under(paths.cudnn_extract_dir, tmp):
            problems.append(
                Problem(
                    ("cudnn_extract_dir",),
                    paths.cudnn_extract_dir,
                    f"expected a persistent directory, not under {tmp} (cuDNN files are "
                    "hard-linked from here into the CUDA dir), e.g. /usr/local/src",
                )
            )
    for field in ("artifact_cache", "cudnn_extract_dir"):
        value = getattr(paths, field)
        if any(p.loc == (field,) for p in problems):
            continue  # one reason per field is enough
        if expected := _root_dir_problem(value):
            problems.append(Problem((field,), value, expected))
    if paths.cuda_link == paths.cuda_dir:
        problems.append(
            Problem(
                ("cuda_link",),
                paths.cuda_link,
                "expected a symlink path different from cuda_dir (e.g. /usr/local/cuda)",
            )
        )
    if problems:
        raise _Problems(problems)
    return paths


def check_user(user: TrainingUser) -> TrainingUser:
    """user.home: a home of its own under HOME_ROOTS, never a system directory."""
    # The user gets to own its home: a system dir there (/etc, /usr, /home itself) is root.
    if user.home in _SYSTEM_DIRS or not any(
        _is_under(user.home, root, strict=True) for root in HOME_ROOTS
    ):
        raise _Problems(
            [
                Problem(
                    ("home",),
                    user.home,
                    f"expected a home directory of its own such as /home/{user.name} "
                    f"(under {', '.join(HOME_ROOTS)}; never a system directory, which the "
                    "user would then own)",
                )
            ]
        )
    return user


def check_apt_mirror(apt: AptMirror) -> AptMirror:
    """A flat suite (ending in '/') has no components or extra suites, any other at least one
    component; signed_by (an existing .gpg or .asc on the controller) or trusted, not both."""
    found: list[tuple[str, Any, str]] = []
    flat = apt.suite.endswith("/")
    if flat and apt.extra_suites:
        found.append(("extra_suites", list(apt.extra_suites), "expected none with a "
                      "flat suite ending in '/' (a flat repository has one)"))  # fmt: skip
    if flat and apt.components:
        found.append(("components", list(apt.components), "expected no components with "
                      "a flat suite ending in '/'"))  # fmt: skip
    if not flat and not apt.components:
        found.append(("components", [], "expected at least one component such as main "
                      "(or a flat suite such as ./)"))  # fmt: skip
    if apt.signed_by is not None and apt.trusted:
        found.append(("trusted", True, "expected trusted: False with signed_by (a signed "
                      "repository is checked, not trusted)"))  # fmt: skip
    elif apt.signed_by is None and not apt.trusted:
        found.append(("signed_by", None, "expected the repository's key file on the "
                      "controller (.gpg or .asc), or trusted: True to turn apt's "
                      "signature check off for this mirror"))  # fmt: skip
    elif apt.signed_by is not None and not apt.signed_by.endswith((".gpg", ".asc")):
        found.append(("signed_by", apt.signed_by, "expected a key file named *.gpg "
                      "(binary) or *.asc (armored), as apt needs"))  # fmt: skip
    elif apt.signed_by is not None and not posixpath.isfile(apt.signed_by):
        found.append(("signed_by", apt.signed_by, "expected an existing key file on the "
                      "controller (gpg --export KEYID > FILE.gpg)"))  # fmt: skip
    if found:
        raise _Problems([Problem((field,), value, text) for field, value, text in found])
    return apt


def check_mirror(mirror: Mirror) -> Mirror:
    """An air-gapped mirror serves every source (artifacts, pip, git, apt, conda)."""
    if not mirror.air_gapped:
        return mirror
    missing = [
        name
        for name, value in (
            ("artifacts_url", mirror.artifacts_url),
            ("pip_index_url", mirror.pip_index_url or mirror.pip_find_links),
            ("git_base_url", mirror.git_base_url),
            ("apt", mirror.apt),
            ("conda_channel", mirror.conda_channel),
        )
        if value is None
    ]
    if missing:
        what = {"apt": "an apt source (url, suite, ...)"}
        raise _Problems([Problem((name,), None, f"expected {what.get(name, 'a mirror URL')}: "
                                 "an air-gapped host has no other source (or set "
                                 "air_gapped: False)") for name in missing])  # fmt: skip
    return mirror


def check_ray(ray: RayCluster) -> RayCluster:
    """Ray's ports apart from one another; its temp dir none of the OS's."""
    problems = []
    if ray.client_server and ray.client_server_port in (ray.port, ray.dashboard_port):
        problems.append(
            Problem(("client_server_port",), ray.client_server_port,
                    f"expected a port other than ray.port {ray.port} and "
                    f"ray.dashboard_port {ray.dashboard_port}")
        )  # fmt: skip
    taken = {ray.port: "ray.port"}
    if ray.dashboard:
        taken[ray.dashboard_port] = "ray.dashboard_port"
    if ray.collective_port in taken:
        problems.append(
            Problem(("collective_port",), ray.collective_port,
                    f"expected a port other than {taken[ray.collective_port]} "
                    f"{ray.collective_port}")
        )  # fmt: skip
    if ray.dashboard and ray.dashboard_port == ray.port:
        problems.append(
            Problem(
                ("dashboard_port",),
                ray.dashboard_port,
                f"expected a port other than ray.port {ray.port}",
            )
        )
    # Ray creates, fills and deletes session dirs here as the training user.
    temp = ray.temp_dir
    if temp in _SYSTEM_DIRS or any(_is_under(temp, tree) for tree in _SYSTEM_TREES):
        problems.append(
            Problem(
                ("temp_dir",),
                temp,
                "expected a directory of Ray's own such as /tmp/ray, not a system "
                "directory or one inside the OS's trees",
            )
        )
    if problems:
        raise _Problems(problems)
    return ray


def check_training_data(data: TrainingData) -> TrainingData:
    """Validation and training files differ."""
    if data.train_file == data.val_file:
        raise _Problems([Problem(("val_file",), data.val_file,
                                 "expected a validation file other than train_file (verl "
                                 "would validate on the training data)")])  # fmt: skip
    return data


def check_stack(
    spec: StackSpec,
    artifacts: tuple[str, ...],
    git_pins: tuple[str, ...],
    env_subdirs: Mapping[str, str],
) -> StackSpec:
    """The rules across the spec's parts: env paths under user.home and apart, root's dirs
    outside it, a changed pin with its own file/sum/commit, training archives reachable, no
    http conda channel without the opt-in. ``artifacts``, ``git_pins``, ``env_subdirs``: the
    pins' lists (``pins.ARTIFACTS``, ``pins.GIT_PINS``, the env defaults under the home)."""
    home = spec.user.home
    problems = [
        Problem(
            ("env", field),
            value,
            f"expected a path under user.home {home!r} (so it survives an OS reinstall "
            f"that keeps /home), e.g. {posixpath.join(home, env_subdirs[field])!r}",
        )
        for field, value in spec.env.model_dump().items()
        if field != "name" and not _is_under(value, home, strict=True)
    ]
    problems += _root_dirs_outside_home(spec)
    if not problems:
        problems += _env_overlaps(spec, env_subdirs)
    problems += _half_done_overrides(spec, artifacts, git_pins)
    problems += _training_archives_reachable(spec)
    problems += _http_conda_channel(spec)
    if problems:
        raise _Problems(problems)
    return spec


def _root_dirs_outside_home(spec: StackSpec) -> list[Problem]:
    """S7: root's downloads and cuDNN tree never inside user.home (a home under /srv or
    /data passes the /home rule): the user can rename any entry of its home, so it could
    swap the directory root runs files from. Parents outside the home are checked on the
    host (``facts.artifacts.UnsafeParent``)."""
    home = spec.user.home
    return [
        Problem(
            ("paths", field),
            value,
            f"expected a root-only directory outside user.home {home!r} (the training user "
            "can rename what is inside its home and swap what root runs), e.g. "
            f"{type(spec.paths).model_fields[field].default}",
        )
        for field in ("artifact_cache", "cudnn_extract_dir")
        if _is_under(value := getattr(spec.paths, field), home)
    ]


def _env_overlaps(spec: StackSpec, env_subdirs: Mapping[str, str]) -> list[Problem]:
    """Env paths that are one another (or inside one another), or in a credentials dir:
    each deploy creates, fills and replaces its own as the training user."""
    problems = []
    paths = [(field, getattr(spec.env, field)) for field in env_subdirs]
    for i, (field, value) in enumerate(paths):
        for other, other_value in paths[:i]:
            if _is_under(value, other_value) or _is_under(other_value, value):
                example = posixpath.join(spec.user.home, env_subdirs[field])
                problems.append(
                    Problem(
                        ("env", field),
                        value,
                        f"expected a directory apart from env.{other} {other_value!r} "
                        f"(not the same, not inside it), e.g. {example!r}",
                    )
                )
                break
        for secret in _CREDENTIAL_DIRS:
            if _is_under(value, posixpath.join(spec.user.home, secret)):
                problems.append(
                    Problem(
                        ("env", field),
                        value,
                        f"expected a directory outside ~/{secret} (the user's credentials, "
                        "which a deploy would then write into)",
                    )
                )
    return problems


def _half_done_overrides(
    spec: StackSpec, artifacts: tuple[str, ...], git_pins: tuple[str, ...]
) -> list[Problem]:
    """A changed version with the old version's file/sum/commit left in place."""
    problems = []
    mirrored = spec.mirror is not None and spec.mirror.artifacts_url is not None
    for name in artifacts:
        artifact: Artifact = getattr(spec, name)
        default = type(artifact).model_fields["version"].default
        if "version" not in artifact.model_fields_set or artifact.version == default:
            continue
        needed = ["filename", "sha256"] + ([] if mirrored else ["url"])
        missing = [key for key in needed if key not in artifact.model_fields_set]
        if missing:
            problems.append(
                Problem(
                    (name, "version"),
                    artifact.version,
                    f"also set {', '.join(f'{name}.{key}' for key in missing)} for this "
                    f"version (the defaults belong to {default})",
                )
            )
    for name in git_pins:
        pin: GitPin = getattr(spec, name)
        changed = {"ref", "commit"} & pin.model_fields_set
        default_pin = type(pin)()
        if not changed or (pin.ref, pin.commit) == (default_pin.ref, default_pin.commit):
            continue
        needed = ["ref", "commit"] + (["version"] if name == "verl" else [])
        missing = [key for key in needed if key not in pin.model_fields_set]
        if missing:
            problems.append(
                Problem(
                    (name, sorted(changed)[0]),
                    getattr(pin, sorted(changed)[0]),
                    f"also set {', '.join(f'{name}.{key}' for key in missing)} "
                    f"(the defaults belong to {default_pin.ref} = {default_pin.commit[:12]})",
                )
            )
    return problems


def _http_conda_channel(spec: StackSpec) -> list[Problem]:
    """An http:// conda channel only with policy.allow_http_conda_channel (N7)."""
    channel = spec.mirror.conda_channel if spec.mirror is not None else None
    if not channel or not channel.startswith("http://"):
        return []
    if spec.policy.allow_http_conda_channel:
        return []
    text = (
        "expected an https:// channel (conda fetches the env's packages from it; plain "
        "http lets the network answer): serve the mirror over https, or set "
        "stack.policy.allow_http_conda_channel: True to accept http (the env's files are "
        "still checked against files/conda-env-<variant>.txt)"
    )
    return [Problem(("mirror", "conda_channel"), channel, text)]


def _training_archives_reachable(spec: StackSpec) -> list[Problem]:
    """A training archive needs a URL unless the mirror's artifacts serve it."""
    if spec.mirror is not None and spec.mirror.artifacts_url:
        return []
    return [
        Problem(("training", which, "archive", "url"), None,
                "expected a URL for the archive (or set mirror.artifacts_url)")
        for which in ("model", "data")
        if (archive := getattr(spec.training, which).archive) is not None
        and archive.url is None
    ]  # fmt: skip
