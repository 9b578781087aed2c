"""The device check's one result (scripts/gpu_check.sh): its parts' files gathered into one JSON
and one markdown, each part with its time limit, elapsed seconds and exit status.

    python scripts/gpu_report.py OUT_DIR [--results benchmarks/results]

Reads from OUT_DIR: parts.tsv (one line per part: name, limit s, elapsed s, exit status;
124 = cut at its limit), environment.json, static_profile.json (part a), forced-*.json
(parts b and c: one per trace), tests.xml (part d, JUnit) and gpu_llamacpp.json (part e); a
missing file is reported as missing. Writes gpu-check-DATE-GPU.json and .md to OUT_DIR and
to --results.
"""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

#: The bars of the gpu-runtime issue for the forced runs: auto over the target alone.
BARS = {"copy": {1: 3.0, 32: 1.5}, "first-turn": {1: 1.2}}
PART_NAMES = {"a": "static runtime's cost profile, CUDA graphs", "b": "the engine, trace-forced (with c: predicted)",
              "d": "exactness tests on cuda", "e": "llama.cpp on CUDA"}


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parts(out: Path) -> list[dict]:
    rows = []
    for line in (out / "parts.tsv").read_text().splitlines() if (out / "parts.tsv").exists() else []:
        name, limit, elapsed, status = line.split("\t")
        rows.append({"part": name, "limit_s": int(limit), "elapsed_s": int(elapsed), "exit": int(status),
                     "cut": int(status) in (124, 137)})
    return rows


def tests(path: Path) -> dict | None:
    if not path.exists():
        return None
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")} | {"failed": failed}


def forced_summary(result: dict) -> dict[str, dict[str, float | None]]:
    """Per batch: ms/token measured and predicted per role, and auto's ratio to the target alone."""
    table: dict[str, dict] = {}
    for run in result.get("runs", []):
        row = table.setdefault(str(run["batch"]), {})
        row[run["role"]] = {"method": run["method"], "measured_ms": run["measured"]["ms_per_token"],
                            "predicted_ms": run["predicted"]["ms_per_token"], "ratio": run["ratio"],
                            "complete": run["complete"]}
    for row in table.values():
        alone, auto = row.get("target alone"), row.get("auto")
        if alone and auto and alone["measured_ms"] and auto["measured_ms"]:
            row["auto_speedup"] = round(alone["measured_ms"] / auto["measured_ms"], 3)
    return table


def gather(out: Path) -> dict:
    forced = {}
    for path in sorted(out.glob("forced-*.json")):
        data = _load(path)
        forced[path.stem.removeprefix("forced-")] = {"settings": (data or {}).get("settings"),
                                                     "batches": forced_summary(data or {})}
    profile = _load(out / "static_profile.json")
    return {"environment": _load(out / "environment.json"), "parts": parts(out),
            "static_profile": profile, "forced": forced, "tests": tests(out / "tests.xml"),
            "llamacpp": _load(out / "gpu_llamacpp.json"), "llamacpp_profile": _load(out / "llamacpp_cuda_profile.json")}


def markdown(result: dict) -> str:
    env = result["environment"] or {}
    lines = [f"# Device check ({env.get('date', '?')}, {env.get('gpu', 'no GPU')})", "",
             f"torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, host CPU {env.get('host_cpu', '?')}. "
             "Command: `scripts/gpu_check.sh`. Random weights of the real shapes; the forced runs follow traces "
             "recorded from the real models on a CPU.", "", "## Parts", "", "| part | limit s | elapsed s | exit |",
             "|---|---|---|---|"]
    for p in result["parts"]:
        lines.append(f"| {p['part']}: {PART_NAMES.get(p['part'], '')} | {p['limit_s']} | {p['elapsed_s']} | "
                     f"{p['exit']}{' (cut)' if p['cut'] else ''} |")
    profile = result["static_profile"] or {}
    lines += ["", "## a. The static runtime's forward (ms; one sequence, n tokens after 256)", ""]
    for model, table in profile.get("models", {}).items():
        shown = ", ".join(f"{n}: {table[n] * 1e3:.2f}" for n in ("1", "4", "16", "32", "64") if n in table)
        capture = profile.get("capture", {}).get(model, {})
        lines.append(f"- {model}: {shown}; {capture.get('graphs', 0)} graphs captured in "
                     f"{capture.get('seconds', 0)} s")
    for trace, data in result["forced"].items():
        lines += ["", f"## b, c. Trace-forced engine, {trace} (ms per token: measured / predicted, ratio)", "",
                  "| batch | target alone | best 2-level | best 3-level | auto | auto speed-up | bar |",
                  "|---|---|---|---|---|---|---|"]
        kind = "copy" if "copy" in trace else "first-turn"
        for batch, row in data["batches"].items():
            cells = [f"{r['measured_ms']} / {r['predicted_ms']}, {r['ratio']}" + ("" if r["complete"] else " (cut)")
                     if (r := row.get(role)) else "" for role in ("target alone", "best 2-level", "best 3-level", "auto")]
            bar = BARS[kind].get(int(batch))
            lines.append(f"| {batch} | " + " | ".join(cells) + f" | {row.get('auto_speedup', '')} | "
                         f"{f'{bar}x' if bar else ''} |")
    t = result["tests"]
    lines += ["", "## d. Exactness tests on cuda", "",
              f"{t['tests']} tests, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped"
              + (f": {', '.join(t['failed'])}" if t["failed"] else "") if t else "no test report (tests.xml missing)"]
    lines += ["", "## e. llama.cpp on CUDA", "", _llamacpp(result["llamacpp"], result["llamacpp_profile"])]
    return "\n".join(lines) + "\n"


def _llamacpp(found: dict | None, profile: dict | None) -> str:
    if not found:
        return "no report (gpu_llamacpp.json missing)"
    line = f"{found.get('result')}: {found.get('reason', '')}"
    for model, table in (profile or {}).get("models", {}).items():
        shown = ", ".join(f"{n}: {table[n] * 1e3:.2f}" for n in ("1", "4", "16", "32", "64") if n in table)
        line += f"\n- {model} (ms, every layer on the GPU): {shown}"
    return line


def stem(result: dict) -> str:
    env = result["environment"] or {}
    gpu = re.sub(r"[^a-z0-9]+", "-", str(env.get("gpu", "nogpu")).lower()).strip("-")
    return f"gpu-check-{str(env.get('date', 'undated'))[:10]}-{gpu}"


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--results", type=Path, default=Path(__file__).resolve().parent.parent / "benchmarks" / "results")
    args = ap.parse_args(argv)
    result = gather(args.out)
    name = stem(result)
    for folder in (args.out, args.results):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (folder / f"{name}.md").write_text(markdown(result))
    print(f"wrote {name}.json and .md to {args.out} and {args.results}")
    return args.out / f"{name}.md"


if __name__ == "__main__":
    main()
