"""kimi-plan --check-log: the plan next to what one vLLM start-up log says, and the calibration case it makes.

An operator runs it on the first start-up of a deployment that let vLLM size its own KV cache
(`kimi_kv_cache_memory_from_plan: false`), or on a published log: the settings come from the log itself (the
engine's config line and the API server's "non-default args"), the GPU and, where the log's model path is not a
preset name, the model from the flags; a flag that disagrees with the log is refused, naming both. The result is
the planner's error on the KV budget and tokens, held to the calibration table's tolerance
(tests/fixtures/planner/startup_logs.json), and the table entry for that log, ready to add.

Why hand-written: vLLM's start-up log is text written for people, not a format a library reads. The KV lines are
read by the collection's own parser (kimi_serve.parse_startup_log, which the serve phase uses); the version, the
settings and the weights and graph figures are read here, in the forms vLLM 0.11 to 0.32 print them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.kimi.k2.plugins.module_utils.kimi_overhead import uses_model_runner_v2
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan import kv_dtype_bytes
from ansible_collections.kimi.k2.plugins.module_utils.kimi_plan_options import (
    OPTION_DEFAULTS,
    flag_name,
    plan_from_options,
)
from ansible_collections.kimi.k2.plugins.module_utils.kimi_presets import MODEL_PRESETS, PlanInputError
from ansible_collections.kimi.k2.plugins.module_utils.kimi_serve import parse_startup_log

GIB = 1024**3
# The calibration table's tolerance on the budget and the tokens, and the most a plan may be above its log (above
# is the dangerous side: vLLM told to hold more than it can): docs/planner.md, "Calibration".
TOLERANCE = 0.02
ABOVE_LIMIT = 0.01

# vllm/v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: ..." (the engine of every release the
# calibration set covers, and the lab's 0.32.0); vllm/entrypoints/openai/api_server.py: "vLLM API server version
# %s" (the older API server's, next to "non-default args"; 0.32.0 prints a banner instead).
_VERSION_LINES = (
    re.compile(r"Initializing a V1 LLM engine \(v([0-9][^\s)]*)\)"),
    re.compile(r"vLLM API server version ([0-9]\S*)"),
)
# Settings both lines show under the same names: option name and type.
_SHARED_SETTINGS = {
    "tensor_parallel_size": ("tp", int),
    "pipeline_parallel_size": ("pp", int),
    "data_parallel_size": ("dp", int),
    "decode_context_parallel_size": ("dcp", int),
    "enforce_eager": ("enforce_eager", bool),
    "kv_cache_dtype": ("kv_cache_dtype", str),
}
# The engine's config line (vllm/config/vllm.py's __str__): "key=value, " pairs, a value without commas.
_ENGINE_SETTINGS = {**_SHARED_SETTINGS, "max_seq_len": ("max_model_len", int)}
# The API server's "non-default args: {...}" (vllm/entrypoints/utils.py): what the command line changed. Read
# first, so the engine line (what ran) wins where both show a setting.
_ARG_SETTINGS = {
    **_SHARED_SETTINGS,
    "max_model_len": ("max_model_len", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float),
    "max_num_seqs": ("max_num_seqs", int),
    "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "block_size": ("block_size", int),
    "enable_expert_parallel": ("enable_expert_parallel", bool),
    # Without it the planner would cost a vision encoder's dummy batch that vLLM never ran.
    "language_model_only": ("language_model_only", bool),
}
# The model: the engine line's model='...', else the non-default args' (`vllm serve MODEL` logs it as model_tag).
_MODEL_LINES = (
    re.compile(r"Initializing a V1 LLM engine .*? with config: model='([^']+)'"),
    re.compile(r"non-default args: \{.*?'model(?:_tag)?': '([^']+)'"),
)
_BUDGET_GIVEN = re.compile(r"non-default args: \{.*'kv_cache_memory_bytes': \d+")
# The GPU model runner's figures. "Model loading took %.4f GiB and %.6f seconds" up to 0.2x, "%s GiB memory and"
# in 0.32.0 (the form kimi_start_phases reads, for the pinned release only): this reads both.
# Which GPU model runner ran (vllm/v1/worker/gpu_worker.py "Using V2 Model Runner"; vllm/config/vllm.py's fallback
# warnings "... using the V1 model runner instead.", spelt "v1" in 0.22.0): the planner models the runner the
# release picks for the K2 and DeepSeek architectures (kimi_overhead.MODEL_RUNNER_V2_SINCE), whose profiles differ.
_RUNNER_V2_LINE = re.compile(r"Using V2 Model Runner")
_RUNNER_V1_LINE = re.compile(r"using the V1 model runner instead", re.IGNORECASE)
_WEIGHTS_LINE = re.compile(r"Model loading took ([0-9.]+) GiB")
_GRAPHS_LINE = re.compile(r"Graph capturing finished in [0-9.]+ secs, took ([0-9.]+) GiB")


def _largest(pattern: re.Pattern[str], text: str) -> float | None:
    """Every rank logs its own line; the largest is the safe one (more weights, less cache)."""
    values = [float(match.group(1)) for match in pattern.finditer(text)]
    return max(values) if values else None


def _value(text: str, kind: type) -> Any:
    if kind is bool:
        if text not in ("True", "False"):
            raise ValueError(text)
        return text == "True"
    return kind(text)


@dataclass(frozen=True)
class LogFacts:
    """What one start-up log says: vLLM's figures and the settings it ran with (option name -> value)."""

    kv_tokens: int | None
    available_kv_gib: float | None
    weights_gib_per_gpu: float | None
    graph_capture_gib: float | None
    vllm_version: str | None
    model: str | None
    budget_given: bool
    settings: dict[str, Any] = field(default_factory=dict)
    # "v2", "v1" where the log says which model runner ran, else None (releases before 0.22 never say).
    model_runner: str | None = None


def read_log(text: str) -> LogFacts:
    """The figures and settings of a vLLM start-up log (plain text: `journalctl -o cat`, or a published log)."""
    kv = parse_startup_log(text)
    version = next((match.group(1) for line in _VERSION_LINES if (match := line.search(text))), None)
    settings: dict[str, Any] = {}
    engine_line = re.search(r"Initializing a V1 LLM engine .*", text)
    for source, table, template in (
        (_first_line(text, "non-default args:"), _ARG_SETTINGS, r"'{}': ([^,}}\s]+)"),
        (engine_line.group(0) if engine_line else "", _ENGINE_SETTINGS, r"\b{}=([^,\s)]+)"),
    ):
        for key, (option, kind) in table.items():
            match = re.search(template.format(re.escape(key)), source)
            if match:
                try:
                    settings[option] = _value(match.group(1).strip("'"), kind)
                except ValueError:
                    continue  # a value of another shape (None, a repr) is not a setting the planner takes
    if settings.get("kv_cache_dtype") == "bfloat16":
        settings["kv_cache_dtype"] = "bf16"  # vLLM's spelling of the planner's bf16 (later releases accept it)
    if "max_model_len" not in settings and kv["concurrency_tokens_per_request"]:
        # "Maximum concurrency for N tokens per request": N is the max_model_len vLLM ran with.
        settings["max_model_len"] = kv["concurrency_tokens_per_request"]
    model = next((match.group(1) for line in _MODEL_LINES if (match := line.search(text))), None)
    return LogFacts(
        kv_tokens=kv["kv_tokens"],
        available_kv_gib=kv["available_kv_gib"],
        weights_gib_per_gpu=_largest(_WEIGHTS_LINE, text),
        graph_capture_gib=_largest(_GRAPHS_LINE, text),
        vllm_version=version,
        model=model,
        budget_given=bool(_BUDGET_GIVEN.search(text)),
        settings=settings,
        model_runner=_model_runner(text),
    )


def _model_runner(text: str) -> str | None:
    if _RUNNER_V2_LINE.search(text):
        return "v2"
    if _RUNNER_V1_LINE.search(text):
        return "v1"
    return None


def _runner_problem(facts: LogFacts, version: str) -> str | None:
    """A log whose model runner is not the one the planner models for its release (a forced or fallen-back runner):
    its sampler terms differ, so its figures would be put down to the wrong ones."""
    modelled = "v2" if uses_model_runner_v2(version) else "v1"
    if facts.model_runner is None or facts.model_runner == modelled:
        return None
    return (
        f"the log ran Model Runner {facts.model_runner.upper()}, where the planner models "
        f"{modelled.upper()} for vLLM {version} (docs/planner.md, 'Model Runner V2'): its sampler terms differ"
    )


def _first_line(text: str, marker: str) -> str:
    return next((line for line in text.splitlines() if marker in line), "")


def measured_weights_bytes(options: dict[str, Any], weights_gib_per_gpu: float | None) -> int | None:
    """The log's "Model loading took X GiB" per GPU as the planner's --weights-bytes: with TP only every rank holds
    the same share, so tp x X is exact. None with PP (the stages differ) or without the figure."""
    try:
        tp, pp = int(options.get("tp") or 1), int(options.get("pp") or 1)
    except (TypeError, ValueError):
        return None  # the planner refuses such a value itself, naming its flag
    if weights_gib_per_gpu is None or pp != 1:
        return None
    return round(weights_gib_per_gpu * GIB * tp)


def _same(option: str, given: Any, logged: Any) -> bool:
    if option == "kv_cache_dtype":
        return _same_dtype(given, logged)
    if isinstance(logged, bool):
        return str(given).lower() in (("true", "1", "yes") if logged else ("false", "0", "no"))
    try:
        return float(given) == float(logged)
    except (TypeError, ValueError):
        return str(given) == str(logged)


def _same_dtype(one: Any, other: Any) -> bool:
    """The same KV cache to the planner: the same bytes per element, as the planner counts them ('auto', the
    model's BF16, and vLLM's 'bfloat16' are two; every FP8 variant is one)."""
    return kv_dtype_bytes(str(one).lower()) == kv_dtype_bytes(str(other).lower())


def _model_option(options: dict[str, Any], facts: LogFacts) -> str:
    if options.get("model"):
        return str(options["model"])
    name = Path(facts.model).name if facts.model else None
    if name in MODEL_PRESETS:
        return name
    said = (
        f"the log's model {facts.model!r} is not a preset ({', '.join(MODEL_PRESETS)})"
        if facts.model
        else "the log names no model"
    )
    raise PlanInputError("--model", f"{said}: give the preset or its config.json")


def _starts_problem(text: str) -> str | None:
    """A file of several starts (a unit's whole journal) mixes their figures: one start's lines are asked for.
    DP engines of one start log one engine line each, the same config, so only different lines count."""
    configs = {
        line.split("Initializing a V1 LLM engine", 1)[1]
        for line in text.splitlines()
        if "Initializing a V1 LLM engine" in line
    }
    versions = {match.group(1) for pattern in _VERSION_LINES for match in pattern.finditer(text)}
    if len(configs) > 1 or len(versions) > 1:
        return (
            f"the log holds more than one start ({max(len(configs), len(versions))} engine configs or versions): "
            "give one start's lines (journalctl -o cat _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID "
            "--value UNIT))"
        )
    return None


def check_options(options: dict[str, Any], facts: LogFacts) -> dict[str, Any]:
    """The planner's options for the log: the log's settings, the flags' where the log is silent. A flag that
    says otherwise than the log is refused (PlanInputError naming the flag and the log's value)."""
    if facts.kv_tokens is None and facts.available_kv_gib is None:
        # A start that failed on its budget logs 'Available KV cache memory' (negative) and no tokens: the budget
        # alone is checked then.
        raise PlanInputError(
            "--check-log",
            "the log has neither an 'Available KV cache memory' nor a 'KV cache size: N tokens' line (is it a "
            "start-up log?)",
        )
    if facts.budget_given:
        raise PlanInputError(
            "--check-log",
            "vLLM was started with kv_cache_memory_bytes (its 'non-default args'), so its KV budget is the one it "
            "was given, not one it measured: start it once without (kimi_kv_cache_memory_from_plan: false)",
        )
    for option in ("tp", "pp"):  # vLLM's default is 1, but a log without the engine line may be an excerpt
        if option not in facts.settings and options.get(option) is None:
            raise PlanInputError(
                flag_name(option), "neither the log's engine config line nor its arguments show it: give it"
            )
    merged = dict(options)
    for option, logged in facts.settings.items():
        given = options.get(option)
        if given is not None and given is not False and not _same(option, given, logged):
            raise PlanInputError(flag_name(option), f"{given} disagrees with the log, which ran with {logged}")
        if given is None or given is False:
            merged[option] = logged
    if facts.vllm_version:
        given = options.get("vllm_version")
        if given is not None and str(given) != facts.vllm_version:
            raise PlanInputError("--vllm-version", f"{given} disagrees with the log's vLLM {facts.vllm_version}")
        merged["vllm_version"] = facts.vllm_version
    elif options.get("vllm_version") is None:
        raise PlanInputError("--vllm-version", "the log names no vLLM version (no engine or API server line): give it")
    merged["model"] = _model_option(options, facts)
    if merged.get("weights_bytes") is None and merged.get("params") is None:
        measured = measured_weights_bytes(merged, facts.weights_gib_per_gpu)
        if measured is not None:
            merged["weights_bytes"] = measured
    return merged


def relative_error(planned: float, logged: float) -> float:
    """Positive above the log (the dangerous side). abs(): a negative logged budget (a start that failed) keeps
    above the log positive. The bench reads its errors from here too."""
    return (planned - logged) / abs(logged)


def _error(planned: float, logged: float | None) -> float | None:
    return None if not logged else relative_error(planned, logged)


@dataclass(frozen=True)
class Check:
    """The plan against one log: errors are (planned - logged) / logged, so above the log is positive."""

    options: dict[str, Any]
    facts: LogFacts
    plan: dict[str, Any]
    budget_error: float | None
    tokens_error: float | None
    # The weights the plan used are the log's "Model loading took" (not given by a flag, not the breakdown).
    weights_measured: bool

    @property
    def within_tolerance(self) -> bool:
        return all(error is None or abs(error) <= TOLERANCE for error in (self.budget_error, self.tokens_error))

    @property
    def above_log(self) -> bool:
        return any(error is not None and error > ABOVE_LIMIT for error in (self.budget_error, self.tokens_error))

    @property
    def passes(self) -> bool:
        return self.within_tolerance and not self.above_log


def check_log(text: str, options: dict[str, Any]) -> Check:
    problem = _starts_problem(text)
    if problem:
        raise PlanInputError("--check-log", problem)
    facts = read_log(text)
    merged = check_options(options, facts)
    plan = plan_from_options(merged)
    # Only a plan that models vLLM's overhead has sampler terms (the plan says whether it does: not the CPU
    # backend, not --overhead-model none); elsewhere the runner does not matter.
    runner_problem = _runner_problem(facts, plan["vllm_version"]) if plan.get("overhead_model") == "vllm" else None
    if runner_problem:
        raise PlanInputError("--check-log", runner_problem)
    return Check(
        options=merged,
        facts=facts,
        plan=plan,
        budget_error=_error(plan["kv_cache_gib_per_gpu"], facts.available_kv_gib),
        tokens_error=_error(plan["kv_tokens"], facts.kv_tokens),
        weights_measured=merged.get("weights_bytes") is not None and options.get("weights_bytes") is None,
    )


def _is_default(option: str, value: Any) -> bool:
    """The planner's default, as vLLM logs it (DP 1 for the planner's None, 'auto' for its bf16)."""
    default = OPTION_DEFAULTS.get(option)
    if option == "kv_cache_dtype":
        return _same_dtype(value, default)
    return value == default or (option == "dp" and value == 1)


def _model_label(model: str) -> str:
    path = Path(model)
    return path.parent.name if path.name == "config.json" else path.name


def calibration_case(check: Check, source: str) -> dict[str, Any]:
    """The entry for tests/fixtures/planner/startup_logs.json (its README names each key). The options keep what
    differs from the planner's defaults, and never the measured weights (the table feeds those itself)."""
    measured = check.weights_measured
    options = {
        key: value
        for key, value in check.options.items()
        if (key in ("model", "gpu", "vllm_version") or not _is_default(key, value))
        and not (key == "weights_bytes" and measured)
    }
    facts = check.facts
    settings = ", ".join(f"{flag_name(key)} {value}" for key, value in options.items() if key != "model")
    label = "-".join((_model_label(str(options["model"])), str(options.get("gpu") or "gpu"),
                      f"tp{options.get('tp', 1)}", str(options["vllm_version"])))  # fmt: skip
    case: dict[str, Any] = {
        "id": label,
        "source": source,
        "vllm_version_note": f"vLLM {options['vllm_version']} (the log's engine or API server line)",
        "settings_known": f"{options['model']}: {settings}; every other setting vLLM's default",
        "options": options,
        "logged": {"available_kv_cache_gib": facts.available_kv_gib, "gpu_kv_cache_tokens": facts.kv_tokens},
        "weights": (
            f"measured: 'Model loading took {facts.weights_gib_per_gpu} GiB' per GPU, fed as --weights-bytes x "
            f"{options.get('tp', 1)}"
            if measured
            else "the planner's component breakdown (no 'Model loading took' the table can feed: none logged, or PP)"
        ),
        "fits_constant": False,
    }
    if measured:
        case["weights_gib_per_gpu_logged"] = facts.weights_gib_per_gpu
    if facts.graph_capture_gib is not None:
        case["graph_capture_gib_logged"] = facts.graph_capture_gib
    return case


def _percent(error: float | None) -> str:
    return "-" if error is None else f"{error:+.2%}"


def render_check(check: Check, log_name: str) -> str:
    """The readable comparison bin/kimi-plan prints."""
    plan, facts = check.plan, check.facts
    logged_budget = "-" if facts.available_kv_gib is None else f"{facts.available_kv_gib:.2f} GiB"
    logged_tokens = "- (the start failed before it)" if facts.kv_tokens is None else f"{facts.kv_tokens:,}"
    lines = [
        f"the plan against {log_name} (vLLM {check.options['vllm_version']}, {check.options['model']}, "
        f"tp {check.options.get('tp', 1)}, pp {check.options.get('pp', 1)})",
        f"  KV budget per GPU  planned {plan['kv_cache_gib_per_gpu']:.2f} GiB, logged {logged_budget}"
        f"  {_percent(check.budget_error)}",
        f"  KV tokens          planned {plan['kv_tokens']:,}, logged {logged_tokens}  {_percent(check.tokens_error)}",
        "  weights per GPU    "
        + (
            f"the log's 'Model loading took {facts.weights_gib_per_gpu} GiB'"
            if check.weights_measured
            else f"{plan['weights_gib_per_gpu']:.2f} GiB, the planner's breakdown"
        ),
    ]
    if check.passes:
        verdict = f"within {TOLERANCE:.0%} and not above the log: the calibration table's tolerance"
    elif check.above_log:
        verdict = f"ABOVE the log by more than {ABOVE_LIMIT:.0%}: vLLM would be told to hold more than it can"
    else:
        verdict = f"more than {TOLERANCE:.0%} under the log: the plan leaves KV cache unused"
    lines.append(f"  verdict: {verdict}")
    return "\n".join(lines)
