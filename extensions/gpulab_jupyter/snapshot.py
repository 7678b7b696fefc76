"""The JSON bodies of the GPU routes, built from what the sampler holds (pure functions)."""

from __future__ import annotations

HISTORY_FIELDS = ("utilization", "memory_used", "temperature", "power_draw")


def gpu_rows(devices: list, values: dict[str, dict]) -> list[dict]:
    rows = []
    for i, d in enumerate(devices):
        rows.append(
            {
                "index": i,
                "uuid": d.uuid,
                "name": d.name,
                "nvml_index": d.nvml_index,
                "mig": d.is_mig,
                "parent_uuid": d.parent_uuid,
                "memory_total": d.memory_total,
                "power_limit": d.power_limit,
                **values.get(d.uuid, {}),
            }
        )
    return rows


def summarize(rows: list[dict]) -> dict:
    """Totals for the status bar: mean utilization, summed memory."""
    utils = [r["utilization"] for r in rows if r.get("utilization") is not None]
    used = [r["memory_used"] for r in rows if r.get("memory_used") is not None]
    total = [r["memory_total"] for r in rows if r.get("memory_total") is not None]
    return {
        "count": len(rows),
        "utilization": round(sum(utils) / len(utils), 1) if utils else None,
        "memory_used": sum(used) if used else None,
        "memory_total": sum(total) if total else None,
    }


def sampler_stats(stats: dict, n_devices: int) -> dict:
    ticks = stats["ticks"] or 1
    reads = stats["proc_reads"] or 1
    return {
        "ticks": stats["ticks"],
        "tick_us_per_gpu": round(stats["tick_seconds"] / ticks / max(1, n_devices) * 1e6, 1),
        "process_read_ms": round(stats["proc_seconds"] / reads * 1e3, 2),
        "cpu_seconds": round(stats["tick_cpu_seconds"] + stats["proc_cpu_seconds"], 4),
        "errors": stats.get("errors", 0),
    }


def history_body(rows: list[tuple[float, dict]], devices: list) -> dict:
    """Column-wise series per GPU: ``{"timestamps": [...], "gpus": {uuid: {field: [...]}}}``."""
    body: dict = {"timestamps": [round(t, 3) for t, _ in rows], "gpus": {}}
    empty = (None,) * len(HISTORY_FIELDS)
    for d in devices:
        columns = list(zip(*(values.get(d.uuid, empty) for _, values in rows), strict=True))
        if not columns:
            columns = [()] * len(HISTORY_FIELDS)
        body["gpus"][d.uuid] = {k: list(c) for k, c in zip(HISTORY_FIELDS, columns, strict=True)}
    return body
