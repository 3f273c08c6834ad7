"""benchmarks/bench_scale.py's arithmetic: the line fit, pyinfra's default parallelism and the
1,000-host extrapolation docs/scale.md shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_scale  # noqa: E402


def test_fit_line_is_least_squares_and_needs_two_sizes():
    assert bench_scale.fit_line([(1, 3.0), (8, 10.0), (32, 34.0)]) == pytest.approx((2.0, 1.0))
    # noisy points: the least-squares line, not the line through the ends
    a, b = bench_scale.fit_line([(1, 1.0), (1, 3.0), (8, 9.0), (32, 34.0)])
    assert (a, b) == pytest.approx((11.75 - 670.5 / 649 * 10.5, 670.5 / 649))  # Sxy / Sxx
    with pytest.raises(ValueError, match="two sizes"):
        bench_scale.fit_line([(8, 1.0), (8, 2.0)])


_PYINFRA_PARALLEL = """
import json, resource, sys
from unittest import mock
cpus, hosts, nofile = (int(x) for x in sys.argv[1:])
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
import pyinfra.api.state as state_module  # MAX_PARALLEL is read from the limit at import
from pyinfra.api import Config, Inventory, State
config = Config()
with mock.patch.object(state_module, "cpu_count", return_value=cpus):
    State(Inventory(([f"h{i}" for i in range(hosts)], {})), config)
print(json.dumps(config.PARALLEL))
"""


@pytest.mark.parametrize(
    ("cpus", "hosts", "nofile", "expected"),
    [(2, 1000, 1024, 40), (16, 1000, 1024, 320), (64, 1000, 1024, 338), (2, 8, 1024, 8),
     (64, 1000, 4096, 1000)],
)  # fmt: skip
def test_default_parallel_is_what_pyinfra_itself_picks(cpus, hosts, nofile, expected):
    ours = bench_scale.pyinfra_default_parallel(cpus, hosts, nofile)
    proc = subprocess.run([sys.executable, "-c", _PYINFRA_PARALLEL, str(cpus), str(hosts),
                           str(nofile)], capture_output=True, text=True, check=True)  # fmt: skip
    assert ours == json.loads(proc.stdout) == expected


def test_extrapolation_arithmetic():
    lines = {"controller_cpu_s": (0.5, 0.07), "peak_rss_mb": (60.0, 1.5), "max_fds": (12.0, 1.0)}
    out = bench_scale.extrapolate(lines, one_host_wall_s=2.0, hosts=1000, cpus=2, nofile=1024)
    assert out["parallel"] == 40  # min(2 * 20, 1000, round(1014 / 3) = 338)
    assert out["controller_cpu_s"] == pytest.approx(70.5)  # 0.5 + 0.07 * 1000
    assert out["peak_rss_mb"] == pytest.approx(1560.0)
    assert out["fds_needed"] == 1012 and out["nofile_ok"]
    assert out["rounds"] == 25 and out["wall_hosts_s"] == pytest.approx(50.0)
    assert out["wall_s"] == pytest.approx(70.5)  # the controller's one core is the bound
    wide = bench_scale.extrapolate(lines, 2.0, 1000, 2, 1000, parallel=1000)
    assert wide["rounds"] == 1 and wide["wall_s"] == pytest.approx(70.5)
    assert not wide["nofile_ok"]  # 1,012 fds needed, 1,000 allowed
    slow = bench_scale.extrapolate(lines, 8.0, 1000, 2, 1024)
    assert slow["wall_s"] == pytest.approx(200.0)  # 25 rounds of 8 s: the pool is the bound


def test_probe_fits_the_fact_bound_only_while_the_cpu_floor_does():
    from p40fleet.privdrop import FACT_TIMEOUT_S

    assert FACT_TIMEOUT_S == 120  # docs/scale.md's arithmetic uses it
    assert bench_scale.probe_fits(9.46, 8, 2)  # 37.8 s of floor
    assert not bench_scale.probe_fits(9.46, 32, 2)  # 151.4 s > 120 s
    assert bench_scale.probe_fits(9.46, 32, 2, bound_s=160)


def test_recorded_extrapolation_is_the_report_of_the_recorded_sessions():
    """docs/scale.md's 1,000-host table quotes extrapolation-1000.json: it must be what
    ``--extrapolate`` computes from every recorded session (no-op at 1, 8 and 32 hosts)."""
    scale = REPO / "docs" / "measurements" / "scale"
    sessions = sorted(scale.glob("bench-scale-session*.json"))
    recorded = json.loads((scale / "extrapolation-1000.json").read_text())
    assert recorded["from"] == [str(p.relative_to(REPO)) for p in sessions]
    report = bench_scale.extrapolation_report(sessions, hosts=1000, cpus=2, nofile=1024)
    assert json.loads(json.dumps(report["modes"])) == recorded["modes"]
    noop_sizes = {
        r["hosts"]
        for p in sessions
        for r in json.loads(p.read_text())["results"]
        if r["mode"] == "noop"
    }
    assert noop_sizes == {1, 8, 32}
