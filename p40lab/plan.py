"""Planning the lab's hosts: CLI-style options to :class:`HostSpec` (index, GPU layout, OS,
kernel headers), and where each host's disk and runtime files live (:func:`host_dirs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from p40lab import fakehw, net
from p40lab import state as st
from p40lab.state import LabError

DEFAULT_LAYOUTS = "4xP40,8xP40,1xP100,2xH200"
OS_CHOICES = {
    "ubuntu20.04": "ubuntu20.04", "focal": "ubuntu20.04", "ubuntu": "ubuntu20.04",
    "debian12": "debian12", "bookworm": "debian12", "debian": "debian12",
}  # fmt: skip


@dataclass
class HostSpec:
    index: int
    layout: str
    os: str = "ubuntu20.04"
    headers: bool = True
    gpus: list[fakehw.GpuModel] = field(default_factory=list)

    @property
    def name(self) -> str:
        return st.host_name(self.index)

    @property
    def ip(self) -> str:
        return st.host_ip(self.index)

    def to_state(self) -> dict:
        d = host_dirs(self.name)
        return {
            "name": self.name, "index": self.index, "ip": self.ip, "layout": self.layout,
            "gpus": [g.pci_id for g in self.gpus], "os": self.os, "headers": self.headers,
            "netns": net.netns_name(self.name), "root": str(d["root"]), "upper": str(d["upper"]),
            "rundir": str(d["run"]), "supervisor_pid": None,
        }  # fmt: skip


def spec_from_state(h: dict) -> HostSpec:
    return HostSpec(
        h["index"], h["layout"], h["os"], h["headers"], fakehw.parse_layout(h["layout"])
    )


def host_dirs(name: str) -> dict[str, Path]:
    top = st.HOSTS_DIR / name
    return {
        "top": top, "upper": top / "upper", "work": top / "work", "root": top / "root",
        "run": st.RUN_DIR / name,
    }  # fmt: skip


# --------------------------------------------------------------------------- planning


def _host_selector(token: str, n: int) -> int:
    token = token.strip()
    idx = int(token) if token.isdigit() else None
    if idx is None and token.startswith(st.HOST_PREFIX) and token[len(st.HOST_PREFIX) :].isdigit():
        idx = int(token[len(st.HOST_PREFIX) :])
    if idx is None or not 1 <= idx <= n:
        raise LabError(f"unknown host {token!r} (hosts are {st.host_name(1)}..{st.host_name(n)})")
    return idx


def plan(
    n: int | None = None,
    gpus: str = DEFAULT_LAYOUTS,
    no_headers: str | list[str] | None = None,
    os_opts: list[str] | None = None,
) -> list[HostSpec]:
    """Turn CLI-style options into host specs.

    gpus: comma-separated per-host layouts (one layout = the same for every host);
    no_headers: host names/indices (comma-separated or list); os_opts: ``debian12`` (all hosts)
    or ``lab3=debian12``.
    """
    layouts = [x.strip() for x in gpus.split(",")] if gpus.strip() else ["0"]
    if n is None:
        n = len(layouts)
    if n < 1 or n > 200:
        raise LabError(f"--hosts {n}: between 1 and 200")
    if len(layouts) == 1:
        layouts *= n
    if len(layouts) != n:
        raise LabError(f"--gpus has {len(layouts)} layouts for {n} hosts: give 1 or {n}")
    specs = []
    for i, layout in enumerate(layouts, 1):
        try:
            specs.append(HostSpec(i, layout, gpus=fakehw.parse_layout(layout)))
        except fakehw.LayoutError as exc:
            raise LabError(f"--gpus {st.host_name(i)}: {exc}") from exc
    if isinstance(no_headers, str):
        no_headers = [x for x in no_headers.split(",") if x.strip()]
    for token in no_headers or []:
        specs[_host_selector(token, n) - 1].headers = False
    for opt in os_opts or []:
        target, _, value = opt.rpartition("=")
        os_name = OS_CHOICES.get(value.strip().lower())
        if os_name is None:
            raise LabError(f"--os {opt!r}: choose one of {', '.join(sorted(set(OS_CHOICES)))}")
        chosen = [_host_selector(t, n) for t in target.split(",")] if target else range(1, n + 1)
        for idx in chosen:
            specs[idx - 1].os = os_name
    return specs
