"""The README's two pictures, drawn as SVG text (no plotting dependency).

``python -m p40fleet.pictures --write`` rewrites ``docs/pictures/layers.svg`` (the deploy layers)
and ``docs/pictures/gpu-memory.svg`` (the plan's memory estimate against the measured peak of
every ``docs/measurements/ppo-*.json``); without ``--write`` it prints both. A test regenerates
them and fails when the committed files are stale.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from p40fleet import gendoc
from p40fleet.paths import REPO

PICTURES = REPO / "docs" / "pictures"
MEASUREMENTS = REPO / "docs" / "measurements"
#: The model every PPO measurement ran (Qwen2.5-0.5B-Instruct's shape, random weights).
MODEL_CONFIG = REPO / "tests" / "fixtures" / "models" / "Qwen2.5-0.5B-Instruct.config.json"
FONT = 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif"'


def _svg(width: int, height: int, body: Sequence[str], title: str) -> str:
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" {FONT} font-size="13">',
            f"<title>{escape(title)}</title>",
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
            *body,
            "</svg>",
            "",
        ]
    )


def _text(x: float, y: float, text: str, **attrs: object) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:g}" y="{y:g}"{extra}>{escape(text)}</text>'


def _labels(cx: float, top: float, title: str, subtitle: str, lines: Sequence[str],
            **line_attrs: object) -> list[str]:  # fmt: skip
    """A box's centred texts: its title, the deploy file under it, then its lines."""
    return [
        _text(cx, top + 24, title, text_anchor="middle", font_size=16, font_weight="bold"),
        _text(cx, top + 44, subtitle, text_anchor="middle", font_size=11, fill="#555"),
        *(_text(cx, top + 64 + 15 * j, line, text_anchor="middle", **line_attrs)
          for j, line in enumerate(lines)),
    ]  # fmt: skip


#: (deploy file, layer, what it does: two short lines)
LAYERS = (
    ("deploy/preflight.py", "preflight", ("every refusal first:", "spec, GPU, OS, space, mirror")),
    ("deploy/system.py", "system", ("nouveau out, driver 525,", "CUDA 11.8, cuDNN 8.9.7")),
    ("deploy/python.py", "python", ("training user, conda env,", "torch, Apex, patched verl")),
    ("deploy/training.py", "training", ("~/launch-ppo.sh sized", "for the host's GPUs")),
    ("deploy/verify.py", "verify", ("PASS / FAIL / REFUSED /", "UNREACHABLE per host")),
)


def layers_svg() -> str:
    """preflight -> system -> python -> training -> verify (deploy/full.py), and Ray beside."""
    box_w, box_h, gap, left, top = 180, 92, 28, 20, 56
    body = [
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#444"/></marker></defs>',
        _text(
            left,
            26,
            "deploy/full.py: one run, every layer in order, then the verification",
            font_size=15,
            font_weight="bold",
        ),
    ]
    for i, (path, name, lines) in enumerate(LAYERS):
        x = left + i * (box_w + gap)
        fill = "#e8f1fb" if name != "verify" else "#eaf6ea"
        body.append(
            f'<g class="layer" data-layer="{name}"><rect x="{x}" y="{top}" width="{box_w}" '
            f'height="{box_h}" rx="8" fill="{fill}" stroke="#36c" stroke-width="1.5"/>'
        )
        body += _labels(x + box_w / 2, top, name, path, lines, font_size=12)
        body.append("</g>")
        if i:
            x0 = x - gap + 2
            body.append(
                f'<line x1="{x0}" y1="{top + box_h / 2}" x2="{x - 2}" y2="{top + box_h / 2}" '
                'stroke="#444" stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
    # Ray: after python (it runs the env's ray), its own deploy, checked by verify
    python_x = left + 2 * (box_w + gap)
    verify_x = left + 4 * (box_w + gap)
    ray_x, ray_y, ray_w = python_x + box_w / 2 + 20, top + box_h + 62, 340
    body.append(
        f'<g class="layer" data-layer="ray"><rect x="{ray_x}" y="{ray_y}" width="{ray_w}" '
        f'height="{box_h - 10}" rx="8" fill="#fdf3e3" stroke="#c80" stroke-width="1.5" '
        'stroke-dasharray="6 4"/>'
    )
    body += _labels(ray_x + ray_w / 2, ray_y, "ray (optional)",
                    "deploy/ray.py, not part of full.py",
                    ["one cluster: head + training nodes, token auth"])  # fmt: skip
    body.append("</g>")
    body.append(
        f'<path d="M{python_x + box_w / 2},{top + box_h + 2} V{ray_y + (box_h - 10) / 2} '
        f'H{ray_x - 2}" fill="none" stroke="#444" stroke-width="1.5" marker-end="url(#arrow)"/>'
    )
    body.append(
        f'<path d="M{ray_x + ray_w + 2},{ray_y + (box_h - 10) / 2} H{verify_x + box_w / 2} '
        f'V{top + box_h + 2}" fill="none" stroke="#444" stroke-width="1.5" '
        'stroke-dasharray="4 3" marker-end="url(#arrow)"/>'
    )
    body.append(_text(verify_x + box_w / 2 + 8, ray_y - 8, "ray checks", font_size=11, fill="#555"))
    body.append(
        _text(
            left,
            ray_y + box_h + 22,
            "Every layer includes the preflight; each step decides from facts, so a "
            "second run changes nothing.",
            font_size=12,
            fill="#333",
        )
    )
    width = left * 2 + 5 * box_w + 4 * gap
    return _svg(
        width,
        ray_y + box_h + 34,
        body,
        "p40fleet's layers: preflight, system, python, training, verify; Ray beside",
    )


@dataclass(frozen=True)
class Point:
    """One PPO measurement: its file, the plan's recorded estimate and the measured peak."""

    file: str
    plan: str
    measured_gib: float  # the largest max_allocated_gib over the run's GPUs
    reserved_gib: float
    estimate_gib: float | None  # the estimate the run recorded (None: the plan had none)
    forced: bool  # the plan was forced by hand after the estimate (extra_overrides)
    today_gib: float | None  # today's estimator for the same plan, when it is one


def _today_estimate(run: Mapping) -> float | None:
    """Today's plan estimate for the run's GPUs (p40fleet.launch, the spec's defaults)."""
    from p40fleet.launch import plan_launch
    from p40fleet.spec import load_spec

    config = json.loads(MODEL_CONFIG.read_text())
    pci = int(str(run["fake_pci"]).split(":")[1], 16)
    plan = plan_launch(load_spec("plot", {}), [pci] * int(run["gpu_count"]), model_config=config)
    return plan.sizing.estimate_gib


def points(directory: Path = MEASUREMENTS) -> list[Point]:
    found = []
    for path in sorted(directory.glob("ppo-*.json")):
        run = json.loads(path.read_text())
        peaks = run["peak_per_gpu"]
        extra = [o for o in run.get("extra_overrides", []) if "total_training_steps" not in o]
        estimate = run["estimate"]["per_gpu_gib"]
        found.append(
            Point(
                file=path.name,
                plan=run["plan"],
                measured_gib=max(g["max_allocated_gib"] for g in peaks),
                reserved_gib=max(g["max_reserved_gib"] for g in peaks),
                estimate_gib=estimate,
                forced=bool(extra),
                today_gib=_today_estimate(run) if estimate is not None and not extra else None,
            )
        )
    return found


def gpu_memory_svg(found: Sequence[Point]) -> str:
    """Estimate (y) against measured peak allocated memory (x), GiB per GPU, one point a file."""
    left, top, size, top_gib = 70, 50, 440, 28.0
    none_y = top + size + 40  # the strip for runs whose plan recorded no estimate

    def sx(gib: float) -> float:
        return left + gib / top_gib * size

    def sy(gib: float) -> float:
        return top + size - gib / top_gib * size

    body = [
        _text(
            left,
            26,
            "Peak GPU memory per GPU: the plan's estimate against verl's measurement",
            font_size=15,
            font_weight="bold",
        ),
        f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="#fafafa" stroke="#999"/>',
    ]
    for gib in range(0, int(top_gib) + 1, 4):
        body.append(
            f'<line x1="{sx(gib):g}" y1="{top}" x2="{sx(gib):g}" y2="{top + size}" '
            'stroke="#e4e4e4"/>'
        )
        body.append(
            f'<line x1="{left}" y1="{sy(gib):g}" x2="{left + size}" y2="{sy(gib):g}" '
            'stroke="#e4e4e4"/>'
        )
        body.append(_text(sx(gib), top + size + 16, str(gib), text_anchor="middle", font_size=11))
        body.append(_text(left - 8, sy(gib) + 4, str(gib), text_anchor="end", font_size=11))
    band = ((0, 0), (top_gib / 1.25, top_gib), (top_gib, top_gib), (top_gib, top_gib * 0.75))
    corners = " ".join(f"{sx(a):g},{sy(b):g}" for a, b in band)
    body.append(f'<polygon points="{corners}" fill="#36c" fill-opacity="0.07"/>')
    body.append(
        f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(top_gib)}" y2="{sy(top_gib)}" '
        'stroke="#36c" stroke-dasharray="5 4"/>'
    )
    body.append(
        _text(
            sx(4.5),
            sy(5.3),
            "estimate = measured; band ±25 %",
            font_size=11,
            fill="#36c",
            transform=f"rotate(-45 {sx(4.5):g} {sy(5.3):g})",
        )
    )
    for cap, name in ((16.0, "P100 16 GiB cap"), (24.0, "P40 24 GiB cap")):
        body.append(
            f'<line x1="{sx(cap):g}" y1="{top}" x2="{sx(cap):g}" y2="{top + size}" '
            'stroke="#c33" stroke-dasharray="2 3"/>'
        )
        body.append(
            _text(sx(cap) - 4, top + 14, name, text_anchor="end", font_size=11, fill="#c33")
        )
    body.append(
        _text(
            left + size / 2,
            none_y + 34,
            "measured peak allocated, GiB per GPU (H200s capped; verl's max allocated)",
            text_anchor="middle",
        )
    )
    body.append(
        _text(
            22,
            top + size / 2,
            "estimated peak, GiB per GPU",
            text_anchor="middle",
            transform=f"rotate(-90 22 {top + size / 2:g})",
        )
    )
    body.append(_text(left - 8, none_y + 4, "none", text_anchor="end", font_size=11, fill="#777"))
    for p in found:
        x = sx(p.measured_gib)
        label = p.file.removeprefix("ppo-").removesuffix(".json")
        if p.estimate_gib is None:
            y, how = none_y, "no estimate recorded (the plan predates the estimator)"
            mark = (
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="#fff" stroke="#777" '
                'stroke-width="2"/>'
            )
        else:
            y = sy(p.estimate_gib)
            how = f"estimate {p.estimate_gib:.3f} GiB recorded by the run"
            if p.forced:
                how += " (plan forced smaller by hand afterwards: the unforced plan's estimate)"
            color = "#c80" if p.forced else "#36c"
            mark = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{color}"/>'
        title = f"{p.file}: measured {p.measured_gib:.3f} GiB allocated, {how}"
        estimate = "" if p.estimate_gib is None else f"{p.estimate_gib:.6f}"
        body.append(
            f'<g class="measurement" data-file="{p.file}" data-measured-gib="{p.measured_gib:.3f}" '
            f'data-estimate-gib="{estimate}"><title>{escape(title)}</title>{mark}</g>'
        )
        body.append(_text(x + 10, y + (4 if p.estimate_gib is None else -8), label, font_size=11))
        if p.today_gib is not None:
            ty = sy(p.today_gib)
            body.append(
                f'<g class="today" data-file="{p.file}" data-estimate-gib="{p.today_gib:.6f}">'
                f"<title>{escape(p.file)}: today's estimate for this plan {p.today_gib:.3f} GiB"
                f"</title>"
                f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{ty:.1f}" stroke="#3a3" '
                'stroke-dasharray="3 2"/>'
                f'<rect x="{x - 5:.1f}" y="{ty - 5:.1f}" width="10" height="10" fill="#3a3"/></g>'
            )
    lx, ly = left + size + 24, top + 10
    legend = (
        ('<circle cx="{x}" cy="{y}" r="6" fill="#36c"/>', "estimate the run recorded"),
        (
            '<rect x="{x0}" y="{y0}" width="10" height="10" fill="#3a3"/>',
            "today's estimate, same plan",
        ),
        ('<circle cx="{x}" cy="{y}" r="6" fill="#c80"/>', "plan forced smaller by hand"),
        (
            '<circle cx="{x}" cy="{y}" r="6" fill="#fff" stroke="#777" stroke-width="2"/>',
            "no estimate recorded",
        ),
    )
    for i, (shape, words) in enumerate(legend):
        y = ly + 22 * i
        body.append(shape.format(x=lx + 6, y=y, x0=lx + 1, y0=y - 5))
        body.append(_text(lx + 18, y + 4, words, font_size=12))
    notes = (
        "docs/measurements/ppo-*.json: verl 0.5.0, two PPO steps",
        "(the shake-out one), Qwen2.5-0.5B shape, 512 + 512",
        "tokens, on H200s whose allocator is capped at the",
        "P40's 24 GiB or the P100's 16 GiB in every process.",
        "Today's estimate: p40fleet.memory via the launch plan.",
    )
    for i, line in enumerate(notes):
        body.append(_text(lx, ly + 22 * len(legend) + 16 + 16 * i, line, font_size=11, fill="#444"))
    return _svg(
        left + size + 380,
        none_y + 80,
        body,
        "The plan's estimated peak GPU memory against the measured peak",
    )


def pictures() -> dict[Path, str]:
    return {
        PICTURES / "layers.svg": layers_svg(),
        PICTURES / "gpu-memory.svg": gpu_memory_svg(points()),
    }


def main(argv: list[str] | None = None) -> int:
    return gendoc.main("p40fleet.pictures", pictures, argv)


if __name__ == "__main__":
    raise SystemExit(main())
