"""operations.util.progress: the CUDA install and the Apex build say where their log is and how long
they took; the Stopwatch steps run for real against a fake host."""

from __future__ import annotations

from pyinfra.api import FunctionCommand, StringCommand

from p40fleet.facts.cuda import CudaInstall, CudaToolkit, GccMajor
from p40fleet.facts.host import FreeSpace, FreeSpaceInfo
from p40fleet.operations import apex, cuda
from p40fleet.operations.util import progress
from tests.opharness import at, run_op

TMP = "/var/cache/p40fleet"


class FakeHost:
    def __init__(self) -> None:
        self.logs: list[str] = []

    def log(self, message: str) -> None:
        self.logs.append(message)


def _names(result) -> list[str]:
    """Every yielded step: shell commands by their first word, functions by name."""
    out = []
    for command in result.raw:
        if isinstance(command, FunctionCommand):
            out.append(command.function.__name__)
        elif isinstance(command, StringCommand):
            out.append(command.get_raw_value())
    return out


def _run_functions(result, host: FakeHost) -> None:
    for command in result.raw:
        if isinstance(command, FunctionCommand):
            assert command.execute(None, host, {}) is True


def test_cuda_install_names_its_log_and_reports_its_duration():
    r = run_op(
        cuda.toolkit,
        runfile=f"{TMP}/cuda.run",
        version="11.8.0",
        cuda_dir="/usr/local/cuda-11.8",
        tmpdir=TMP,
        tmp_bytes=10,
        max_gcc=11,
        facts={
            CudaToolkit: CudaInstall(),
            GccMajor: 11,
            at(FreeSpace, path=TMP): FreeSpaceInfo(TMP, "/var", "/", 10**12, 10**10),
        },
    )
    names = _names(r)
    sh = next(i for i, n in enumerate(names) if n.startswith(f"sh {TMP}/cuda.run"))
    assert names.index("_stopwatch_start") < sh < names.index("_stopwatch_stop")
    host = FakeHost()
    _run_functions(r, host)
    assert host.logs[0] == "CUDA install: started, log: /var/log/cuda-installer.log"
    assert host.logs[1].startswith("CUDA install: done in ")
    assert host.logs[1].endswith(" s (log: /var/log/cuda-installer.log)")


def test_apex_build_names_its_log_and_reports_its_duration():
    r = run_op(
        apex.build_wheel,
        python="/p/bin/python",
        env_dir="/p",
        remote="http://m/git/apex.git",
        ref="25.09",
        commit="4" * 40,
        key="K",
        cuda_home="/usr/local/cuda-11.8",
        arch_list="6.1",
        max_jobs=2,
        cuda_ext=True,
        user="verl",
        home="/w",
        facts={},
    )
    names = _names(r)
    build = next(i for i, n in enumerate(names) if " wheel " in n)
    assert names.index("_stopwatch_start") < build < names.index("_stopwatch_stop")
    host = FakeHost()
    _run_functions(r, host)
    assert host.logs[0] == "apex build: started, log: /w/build.log"
    assert host.logs[1].startswith("apex build: done in ")


def test_format_seconds():
    assert progress.format_seconds(9.2) == "9 s"
    assert progress.format_seconds(75.4) == "1 min 15 s"
