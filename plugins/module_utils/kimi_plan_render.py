"""The plan as text: what a person reads from bin/kimi-plan and in the kimi_plan module's answer."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------------------------
# Text rendering
# ---------------------------------------------------------------------------------------------------------


def _row(label: str, value: str, width: int = 38) -> str:
    return f"{label:<{width}}: {value}"


def render_text(plan: dict[str, Any]) -> str:
    """A readable budget box (per GPU, or the labelled pooled box)."""
    if plan.get("mode") == "pooled":
        return _render_pooled(plan)
    where = plan["gpu"] or "GPUs"
    title = (
        f"PER-GPU MEMORY BUDGET - {plan['model']} on {plan['nodes']} node(s) x {plan['gpus_per_node']} {where} "
        f"(TP {plan['tp']}, PP {plan['pp']}, DP {plan['dp']}, DCP {plan['dcp']}, "
        f"EP {'on' if plan['enable_expert_parallel'] else 'off'})"
    )
    lines = [title]
    if plan["gpu_memory_gib"] is not None:
        if plan.get("gpu_memory_gib_driver") is not None and plan["gpu_memory_gib_driver"] != plan["gpu_memory_gib"]:
            lines.append(_row("GPU memory the driver reports", f"{plan['gpu_memory_gib_driver']:.2f} GiB"))
        lines.append(_row("GPU memory vLLM sizes from", f"{plan['gpu_memory_gib']:.2f} GiB"))
        lines.append(
            _row(
                f"Usable ({plan['gpu_memory_utilization']:g} x memory - {plan['reserve_gib']:g} GiB reserve)",
                f"{plan['usable_gib_per_gpu']:.2f} GiB",
            )
        )
    for stage in plan["stages"]:
        lines.extend(_render_stage(plan, stage))
    lines.append(
        _row(
            f"KV tokens per replica (blocks of {plan['block_size']})",
            f"{plan['kv_tokens']:,}  (stage {plan['limiting_stage']} decides)",
        )
    )
    lines.append(
        _row(
            f"At max-model-len {plan['max_model_len']:,}",
            f"{plan['kv_gib_per_sequence_per_gpu']:.2f} GiB per sequence per GPU; "
            f"{plan['sequences_per_replica']} per replica x {plan['replicas']} replica(s) = "
            f"{plan['max_concurrent_sequences']} concurrent sequences",
        )
    )
    lines.append(
        _row(
            "Deploy exactly (--kv-cache-memory-bytes)",
            f"{plan['kv_cache_memory_bytes']:,} B -> {plan['kv_tokens_deployed']:,} tokens logged "
            f"(vLLM {plan['vllm_version']})",
        )
    )
    lines.append(_row("Fits", "yes" if plan["fits"] else "NO"))
    lines.extend(f"  - {reason}" for reason in plan["reasons"])
    lines.extend(f"  note: {note}" for note in plan.get("notes", []))
    if plan.get("suggestions"):
        lines.append("Layout changes that would hold more:")
        lines.extend(f"  {item['change']:<24} {item['text']}" for item in plan["suggestions"])
    return "\n".join(lines)


def _render_stage(plan: dict[str, Any], stage: dict[str, Any]) -> list[str]:
    first, last = stage["layers"]
    count = stage["num_layers"]
    lines = [f"Stage {stage['stage']} (layers {first}-{last - 1}, {count} layer{'' if count == 1 else 's'}), per GPU:"]
    source = "even split of --weights-bytes" if plan["weights_source"] == "even-split" else plan["quantization"]
    lines.append(_row("  Weights", f"{stage['weights_gib_per_gpu']:.2f} GiB  ({source})"))
    if plan["weights_source"] != "even-split":
        for key, value in stage["weights_breakdown_gib"].items():
            lines.append(_row(f"    {key.replace('_', ' ')}", f"{value:.3f} GiB"))
    for key, value in stage.get("overhead_breakdown_gib", {}).items():
        if value:
            lines.append(_row(f"  Overhead: {key.replace('_', ' ')}", f"{value:.3f} GiB"))
    kind = "measured" if plan["kv_cache_source"] == "measured" else "usable - weights - overhead"
    lines.append(_row("  --> KV cache", f"{stage['kv_cache_gib_per_gpu']:.2f} GiB  ({kind})"))
    if plan["dcp"] > 1:
        replicated = f"split over DCP {plan['dcp']}"
    elif plan["tp"] > 1:
        replicated = f"replicated on all {plan['tp']} TP ranks"
    else:
        replicated = "one TP rank"
    lines.append(
        _row(
            "  KV per token on this GPU",
            f"{stage['kv_bytes_per_token_per_gpu']:,} B ({count} layer{'' if count == 1 else 's'} x "
            f"{plan['kv_values_per_token_per_layer']} values, {replicated})",
        )
    )
    lines.append(_row("  KV tokens this stage holds", f"{stage['kv_tokens']:,}"))
    return lines


def _render_pooled(plan: dict[str, Any]) -> str:
    lines = [
        plan["warning"],
        f"POOLED MEMORY BUDGET - {plan['model']} on {plan['gpus_total']} GPUs",
        _row("GPUs", f"{plan['total_gpu_gib']:,.1f} GiB"),
        _row("Usable (util x total - reserve x GPUs)", f"{plan['usable_gib']:,.1f} GiB"),
        _row("Weights", f"{plan['weights_gib']:,.1f} GiB"),
        _row("--> KV cache pool", f"{plan['kv_pool_gib']:,.1f} GiB"),
        _row("KV cost per token (all layers)", f"{plan['kv_bytes_per_token'] / 1024:.1f} KiB"),
        _row("Total KV tokens", f"{plan['kv_tokens']:,}  (sum across all concurrent seqs)"),
        _row(f"At max-model-len {plan['max_model_len']:,}", f"{plan['kv_gib_per_sequence']:.1f} GiB per sequence"),
        _row("  max concurrent", f"~{plan['max_concurrent_sequences']} full-length sequences"),
        "",
        "What vLLM actually allocates for this layout (per GPU):",
        render_text(plan["per_gpu_plan"]),
    ]
    return "\n".join(lines)
