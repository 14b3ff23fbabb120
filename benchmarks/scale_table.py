"""The scale table: every preset at the paper's and T5X's batch, the smallest Cloud TPU slice
and the settings that fit, found by compiling the real train step ahead of time (`t2t.aot`).

Nothing runs on a TPU: libtpu's compiler describes each slice (pip install -e '.[tpu]'). For
every (preset, batch, TPU generation) the search compiles the memory-frugal setting (FSDP,
scanned layers, full rematerialization; in 1, then 2, then 4 microbatches) on slices of growing
size, starting where the memory the preset needed elsewhere says it should fit, until the
smallest slice that fits with 10% of HBM left; there, without microbatches, it tries cheaper
settings (no rematerialization, then the selective policy) and keeps the one with the fewest
FLOPs that still fits. Every compile is recorded in the JSON file as it ends,
so an interrupted run resumes where it stopped.

    python benchmarks/scale_table.py                       # the whole table (hours on 2 cores)
    python benchmarks/scale_table.py --presets t5_small --batches 128 --generations v5e
    python benchmarks/scale_table.py --extras               # remat FLOPs, DP vs FSDP, compile time
    python benchmarks/scale_table.py --markdown              # print the table from the results

Results: benchmarks/results/scale_table.json (every compile, with the commit it compiled;
records without one predate that field), printed as Markdown tables. The
compiles of the network before the attention rework (issue 32; commit 3b5ee95) are kept in
benchmarks/results/scale_table_3b5ee95.json: the search starts where they say a preset fits
(`--previous`), and a cell not searched again shows the earlier network's answer, marked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LENGTHS = {"inputs": 512, "targets": 114}
PRESETS = (
    "t5_small",
    "t5_base",
    "t5_large",
    "t5_3b",
    "t5_11b",
    "t5_1_1_small",
    "t5_1_1_base",
    "t5_1_1_large",
    "t5_1_1_xl",
    "t5_1_1_xxl",
)
BATCHES = (128, 2048)
# Slices of each generation, smallest first (chips: 1 or 4 ... 256; v4 and v5p slices start at
# one host of 4 chips, v5e at one chip).
SLICES = {
    "v5e": (
        "v5e:1x1",
        "v5e:2x2",
        "v5e:2x4",
        "v5e:4x4",
        "v5e:4x8",
        "v5e:8x8",
        "v5e:8x16",
        "v5e:16x16",
    ),
    "v4": ("v4:2x2x1", "v4:2x2x2", "v4:2x2x4", "v4:2x4x4", "v4:4x4x4", "v4:4x4x8", "v4:4x8x8"),
    "v5p": (
        "v5p:2x2x1",
        "v5p:2x2x2",
        "v5p:2x2x4",
        "v5p:2x4x4",
        "v5p:4x4x4",
        "v5p:4x4x8",
        "v5p:4x8x8",
    ),
}
FRUGAL = {"sharding_mode": "fsdp", "remat_policy": "full", "num_microbatches": 1}
# Cheaper settings, fewest FLOPs first, and how much more than full rematerialization they keep
# for the backward pass (activations, gradients, temporaries: memory beyond parameters and
# optimizer state), measured on T5.1.1-base at batch 128 on v5e:4x4 (the --extras compiles).
CHEAPER = (
    ({"sharding_mode": "fsdp", "remat_policy": "none", "num_microbatches": 1}, 8.6),
    (
        {"sharding_mode": "fsdp", "remat_policy": "dots_with_no_batch_dims", "num_microbatches": 1},
        2.3,
    ),
)
MICROBATCHES = (1, 2, 4)  # tried in this order on a slice before a larger slice
USABLE = 0.9  # a plan must leave 10% of HBM free
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results", "scale_table.json")
DEFAULT_PREVIOUS = os.path.join(os.path.dirname(__file__), "results", "scale_table_3b5ee95.json")


def chips_of(topology: str) -> int:
    from t2t.aot import targets

    _, dims = targets.parse_topology(topology)
    count = 1
    for d in dims:
        count *= d
    return count


def source_commit() -> str | None:
    """The commit of the t2t being compiled ("+changes" when t2t/ differs from it), or None."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        return subprocess.run(
            ["git", "-C", here, *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", os.path.join(here, "..", "t2t"))
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if changed else "")


def mesh_for(devices: int, batch: int, micro: int) -> tuple[int, int]:
    """Data axis as wide as the rows of a microbatch allow, the rest model parallel."""
    data = devices
    while (batch // micro) % data:
        data //= 2
    return data, devices // data


class Results:
    """The JSON file of compile records, keyed by what was compiled."""

    def __init__(self, path: str, previous: str | None = None):
        self.path = path
        self.records: dict[str, dict] = self._read(path)
        # An earlier network's compiles: where to start searching, and cells not searched again.
        self.previous: dict[str, dict] = self._read(previous) if previous else {}

    @staticmethod
    def _read(path: str) -> dict[str, dict]:
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return {r["key"]: r for r in json.load(f)["compiles"]}

    @staticmethod
    def key(preset, batch, topology, settings, scan=True) -> str:
        return (
            f"{preset}|{batch}|{topology}|{settings['sharding_mode']}|"
            f"{settings['remat_policy']}|{settings['num_microbatches']}|scan={scan}"
        )

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(
                {
                    "lengths": LENGTHS,
                    "compiles": sorted(self.records.values(), key=lambda r: r["key"]),
                },
                f,
                indent=1,
            )
        os.replace(tmp, self.path)


def compile_one(
    results: Results,
    preset: str,
    batch: int,
    topology: str,
    settings: dict,
    scan: bool = True,
    decode: bool = False,
    model_axis: int | None = None,
) -> dict:
    """The record of one compile (from the file if it was done before)."""
    key = Results.key(preset, batch, topology, settings, scan)
    if model_axis is not None:
        key += f"|model={model_axis}"
    if key in results.records:
        return results.records[key]
    from t2t import aot, nn

    target = aot.tpu_target(topology)
    config = nn.get_preset(
        preset,
        dtype="bfloat16",
        dropout_rate=0.0,
        scan_layers=scan,
        remat_policy=settings["remat_policy"],
    )
    mesh = mesh_for(target.num_devices, batch, settings["num_microbatches"])
    if model_axis is not None:
        mesh = (target.num_devices // model_axis, model_axis)
    shape = aot.RunShape(
        config,
        batch,
        LENGTHS,
        mesh_shape=mesh,
        sharding_mode=settings["sharding_mode"],
        num_microbatches=settings["num_microbatches"],
    )
    print(
        f"[{time.strftime('%H:%M:%S')}] {preset} batch {batch} on {topology} "
        f"({target.num_devices} devices, mesh {mesh}) {settings} scan={scan}",
        flush=True,
    )
    start = time.perf_counter()
    try:
        report = aot.compile_run(shape, target, decode=decode, progress=False)
    except Exception as error:  # noqa: BLE001 (recorded: a setting the compiler refuses)
        print(f"    -> failed: {str(error).splitlines()[0][:300]}", flush=True)
        results.records[key] = {
            "key": key,
            "preset": preset,
            "batch": batch,
            "topology": topology,
            "devices": target.num_devices,
            "chips": target.num_chips,
            "mesh": list(mesh),
            "scan_layers": scan,
            **settings,
            "commit": source_commit(),
            "fits": False,
            "memory_fraction": None,
            "memory_bytes": None,
            "compile_seconds": time.perf_counter() - start,
            "error": str(error)[:2000],
        }
        results.save()
        return results.records[key]
    train = report.train_step
    record = {
        "key": key,
        "preset": preset,
        "batch": batch,
        "topology": topology,
        "devices": target.num_devices,
        "chips": target.num_chips,
        "mesh": list(mesh),
        "scan_layers": scan,
        **settings,
        "commit": source_commit(),
        "fits": train.get("fits"),
        "memory_fraction": train.get("memory_fraction"),
        "memory_bytes": (train.get("memory") or {}).get("total"),
        "memory": train.get("memory"),
        "state_bytes": train.get("state_bytes"),
        "compile_seconds": train.get("compile_seconds"),
        "lower_seconds": train.get("lower_seconds"),
        "wall_seconds": time.perf_counter() - start,
        "flops_ratio": train.get("flops_ratio"),
        "cost_model": {
            k: (train.get("cost_model") or {}).get(k)
            for k in ("step_seconds", "mfu", "bound", "hbm_bytes", "matmul_bytes", "other_bytes")
        },
        "attention": report.run.get("attention"),
        "collectives": train.get("collectives"),
        "error": train.get("error"),
        "parameters": report.run["model"]["parameters"],
    }
    if report.decode is not None:
        record["decode"] = {
            k: report.decode.get(k) for k in ("fits", "memory_fraction", "compile_seconds")
        }
    fraction = record["memory_fraction"]
    print(
        f"    -> {'fits' if usable(record) else 'no'} "
        f"({'?' if fraction is None else f'{fraction:.0%}'} of HBM, compiled in "
        f"{record['compile_seconds']:.0f} s)",
        flush=True,
    )
    results.records[key] = record
    results.save()
    return record


def usable(record: dict) -> bool:
    return bool(record["fits"]) and (record["memory_fraction"] or 0) <= USABLE


def smallest_slice(results: Results, preset: str, batch: int, generation: str) -> dict | None:
    """The smallest slice of `generation` where the frugal setting fits (then cheaper ones).

    Starts at the slice where the preset's other compiles say it should fit and walks down
    while it fits (up while it does not).
    """
    slices = SLICES[generation]
    index = _guess(results, preset, batch, generation)
    best, failed = None, set()
    while True:
        record = _frugal_fit(results, preset, batch, slices[index])
        if usable(record):
            best = record
            if index == 0 or index - 1 in failed:
                break
            index -= 1
        else:
            failed.add(index)
            if best is not None or index == len(slices) - 1:
                break
            index += 1
    if best is None:
        return None
    if best["num_microbatches"] > 1:
        return best
    capacity = best["memory_bytes"] / best["memory_fraction"]
    state = sum((best.get("state_bytes") or {}).values())
    for settings, growth in CHEAPER:  # fewer FLOPs, if they fit too
        estimate = state + (best["memory_bytes"] - state) * growth
        if estimate > 1.25 * USABLE * capacity:  # clearly too big: spare the compile
            continue
        record = compile_one(results, preset, batch, best["topology"], settings)
        if usable(record):
            return record
    return best


def _frugal_fit(results: Results, preset: str, batch: int, topology: str) -> dict:
    """The frugal setting on `topology`, in 1, 2 or 4 microbatches: the first that fits."""
    record = None
    for micro in MICROBATCHES:
        if batch % micro:
            break
        record = compile_one(
            results, preset, batch, topology, {**FRUGAL, "num_microbatches": micro}
        )
        if usable(record):
            break
    return record


def _guess(results: Results, preset: str, batch: int, generation: str) -> int:
    """The slice index where memory scaled from other compiles of this preset would fit."""
    from t2t.aot import targets

    capacity = targets.CHIPS[generation].memory_bytes * USABLE
    estimates = []
    for record in [*results.records.values(), *results.previous.values()]:
        if (
            (record["preset"], record["batch"]) == (preset, batch)
            and record["memory_bytes"]
            and record["remat_policy"] == "full"
        ):
            estimates.append(record["memory_bytes"] * record["devices"])  # ~ bytes x devices
    if not estimates:
        return next(i for i, t in enumerate(SLICES[generation]) if chips_of(t) == 16)
    per_chip_total = max(estimates)
    for index, topology in enumerate(SLICES[generation]):
        devices = chips_of(topology) * targets.CHIPS[generation].devices_per_chip
        if per_chip_total / devices <= capacity:
            return index
    return len(SLICES[generation]) - 1


def extras(results: Results) -> None:
    """Remat FLOPs, data parallel vs FSDP memory, collectives, unrolled vs scanned compiles."""
    frugal = dict(FRUGAL)
    for policy in ("none", "dots_with_no_batch_dims", "dots", "full"):
        compile_one(results, "t5_1_1_base", 128, "v5e:4x4", {**frugal, "remat_policy": policy})
    for preset, batch, policy in (
        ("t5_1_1_base", 128, "none"),
        ("t5_1_1_base", 2048, "full"),
        ("t5_1_1_large", 128, "full"),
    ):
        for mode in ("data_parallel", "fsdp"):
            compile_one(
                results,
                preset,
                batch,
                "v5e:4x4",
                {**frugal, "sharding_mode": mode, "remat_policy": policy},
            )
    compile_one(results, "t5_1_1_base", 2048, "v5e:4x4", frugal, decode=True)
    compile_one(results, "t5_1_1_base", 2048, "v5e:4x4", {**frugal, "num_microbatches": 2})
    # Collectives of tensor parallelism and FSDP for T5.1.1-large on 16 v4 chips, unrolled.
    for mode, model_axis in (("tensor_parallel", 4), ("fsdp", 4), ("fsdp", 1)):
        compile_one(
            results,
            "t5_1_1_large",
            128,
            "v4:2x2x4",
            {**frugal, "sharding_mode": mode, "remat_policy": "none"},
            scan=False,
            model_axis=model_axis,
        )
    for scan in (True, False):  # compile time: scanned vs unrolled
        compile_one(results, "t5_1_1_xl", 128, "v5p:2x2x2", frugal, scan=scan)
    # The paper's own slice: 11B at batch 2048 on a v3-1024 (512 chips, 1024 cores).
    compile_one(results, "t5_11b", 2048, "v3:16x32", frugal)


def markdown(results: Results, presets, batches, generations) -> str:
    lines = []
    for batch in batches:
        lines.append(
            f"\n**Batch {batch} x 512/114** (smallest slice with 10% of HBM free; "
            "settings; HBM used; the cost model's estimated MFU at the chip's peak rates; compile "
            "time)\n"
        )
        lines.append("| preset | " + " | ".join(generations) + " |")
        lines.append("|---|" + "---|" * len(generations))
        for preset in presets:
            cells = []
            for generation in generations:
                chosen = _chosen(results.records, preset, batch, generation)
                earlier = ""
                if chosen is None and results.previous:
                    chosen = _chosen(results.previous, preset, batch, generation)
                    earlier = " [network of 3b5ee95, not searched again]"
                if chosen is None:
                    cells.append("not searched")
                elif chosen == "none":
                    cells.append("no slice of <= 256 chips")
                else:
                    chosen, shown = chosen
                    mesh = chosen["mesh"]
                    micro = chosen["num_microbatches"]
                    cells.append(
                        f"{chosen['topology']} ({chosen['chips']} chips): {chosen['sharding_mode']} "
                        f"{mesh[0]}x{mesh[1]}, remat {chosen['remat_policy']}"
                        + (f", {micro} microbatches" if micro > 1 else "")
                        + f", {chosen['memory_fraction']:.0%}"
                        + _mfu(chosen)
                        + f", {chosen['compile_seconds']:.0f} s"
                        + ("" if shown else " (smaller slices not tried)")
                        + earlier
                    )
            lines.append(f"| {preset} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mfu(record: dict) -> str:
    estimate = record.get("cost_model") or {}
    if estimate.get("mfu"):
        return f", MFU ~ {estimate['mfu']:.0%}"
    if record.get("roofline"):  # the earlier report's bound from arguments and outputs only
        return f", MFU <= {record['roofline']['mfu']:.0%} (old bound)"
    return ""


def _chosen(records: dict, preset: str, batch: int, generation: str):
    """The cell's compile: None when nothing was searched, "none" when no slice fits, else
    (record, smallest) where `smallest` says the next smaller slice was shown not to fit (or
    there is none), so the record is the search's answer and not only a slice that fits."""
    records = [
        r
        for r in records.values()
        if (r["preset"], r["batch"]) == (preset, batch)
        and r["scan_layers"]
        and r["topology"] in SLICES[generation]
    ]
    fitting = [r for r in records if usable(r)]
    if not records:
        return None
    if not fitting:
        return "none" if len({r["topology"] for r in records}) > 1 else None
    smallest = min(r["chips"] for r in fitting)
    order = {"none": 0, "dots_with_no_batch_dims": 1, "dots": 2, "full": 3}
    at_smallest = [r for r in fitting if r["chips"] == smallest]
    chosen = min(at_smallest, key=lambda r: (r["num_microbatches"], order[r["remat_policy"]]))
    index = SLICES[generation].index(chosen["topology"])
    below = [
        r
        for r in records
        if index
        and r["topology"] == SLICES[generation][index - 1]
        and (r["sharding_mode"], r["remat_policy"]) == ("fsdp", "full")
    ]
    shown = index == 0 or {r["num_microbatches"] for r in below} >= set(MICROBATCHES)
    return chosen, shown


def refresh(results: Results, presets, batches, generations, policies) -> None:
    """Compiles again the record each cell chose where its remat policy is one of `policies`
    (after a change to the network or the cost model that leaves the search's answer
    standing); a cell whose record no longer fits falls back to what else was compiled."""
    for batch in batches:
        for preset in presets:
            for generation in generations:
                found = _chosen(results.records, preset, batch, generation)
                if not isinstance(found, tuple) or found[0]["remat_policy"] not in policies:
                    continue
                record = found[0]
                del results.records[record["key"]]
                settings = {
                    k: record[k] for k in ("sharding_mode", "remat_policy", "num_microbatches")
                }
                compile_one(results, preset, batch, record["topology"], settings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--generations", default="v5e,v4,v5p")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument(
        "--previous",
        default=DEFAULT_PREVIOUS,
        help="an earlier network's compiles: where searches start, and cells not searched again",
    )
    parser.add_argument("--extras", action="store_true", help="only the extra measurements")
    parser.add_argument("--markdown", action="store_true", help="only print the tables")
    parser.add_argument(
        "--refresh",
        default="",
        help="remat policies (comma-separated): compile again each cell's chosen record that "
        "uses one, keeping the search's answer",
    )
    args = parser.parse_args(argv)
    presets = args.presets.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    generations = args.generations.split(",")
    results = Results(args.out, args.previous)
    if args.extras:
        extras(results)
    elif args.refresh:
        refresh(results, presets, batches, generations, set(args.refresh.split(",")))
    elif not args.markdown:
        for batch in batches:
            for preset in presets:
                for generation in generations:
                    smallest_slice(results, preset, batch, generation)
    print(markdown(results, presets, batches, generations))
    return 0


if __name__ == "__main__":
    sys.exit(main())
