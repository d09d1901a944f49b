"""The verify phase's API checks: is the model served under its name, does a tool call come back as a structured
`tool_calls` entry (not as text), were the parser flags passed to rank 0, and is reasoning split from the answer.

Builders make the request bodies, judges turn a response (or an HTTP failure) into a CheckResult whose detail
says what is wrong and which flag fixes it. run_api_checks() wires them to a small stdlib HTTP client; the
module plugins/modules/kimi_verify_api.py is a thin wrapper over it. Stdlib only: the module runs with the node's
python3.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_TOOL_CALL_PARSER = "kimi_k2"
DETAIL_EXCERPT = 200  # characters of a server body or a model reply quoted in a detail

# Two small tools: enough for the model to have to choose, and for the judge to tell an offered name from an
# invented one.
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Return the current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name, e.g. Athens"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Return the current local time in an IANA time zone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string", "description": "IANA zone, e.g. Europe/Athens"}},
                "required": ["timezone"],
            },
        },
    },
]
TOOL_NAMES = tuple(tool["function"]["name"] for tool in TOOLS)
TOOL_PROMPT = "Use the get_weather tool to look up the current weather in Athens. Do not answer from memory."
REASONING_PROMPT = "What is 17 multiplied by 23? Think it through briefly, then give only the number."

# What a tool call looks like when the server hands it back as text: Kimi K2's own section markers, its
# `functions.NAME:INDEX` call ids, a Hermes-style tag, or a JSON object with a name and its arguments.
KIMI_TOOL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
)
KIMI_CALL_ID = re.compile(r"functions\.([A-Za-z_][\w.-]*):\d*")
TAGGED_CALL = re.compile(r"<tool_call>")
JSON_CALL_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
JSON_CALL_ARGUMENTS = re.compile(r'"(arguments|parameters)"\s*:')
THINK_MARKERS = ("<think>", "</think>", "◁think▷", "◁/think▷")
AUTO_TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")


@dataclass
class CheckResult:
    """One check: passed, failed, or skipped (with the reason in detail). data holds the evidence.

    A skipped check has passed False and skipped True; it is not a failure (status "skip").
    """

    name: str
    passed: bool
    skipped: bool = False
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.skipped:
            return "skip"
        return "pass" if self.passed else "fail"

    @property
    def is_failure(self) -> bool:
        return not self.passed and not self.skipped

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


def passed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, True, False, detail, data)


def failed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, False, False, detail, data)


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, False, True, reason or "skipped")


def excerpt(text: str, limit: int = DETAIL_EXCERPT) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------ HTTP


@dataclass(frozen=True)
class HttpReply:
    """What came back for one request. status is None when no HTTP response arrived (error says why)."""

    status: int | None
    body: str
    error: str = ""
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def api_root(base_url: str) -> str:
    """The server root: accepts http://host:8000, http://host:8000/ and http://host:8000/v1."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def request_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def describe_url_error(error: BaseException) -> str:
    """A short reason for a request that got no HTTP response (refused, timed out, name not resolved)."""
    reason = getattr(error, "reason", error)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    return str(reason) or type(reason).__name__


def http_call(
    url: str, payload: Mapping[str, Any] | None = None, api_key: str | None = None, timeout: float = 60.0
) -> HttpReply:
    """GET (payload None) or POST JSON; never raises for network or HTTP errors."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers=request_headers(api_key))
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read().decode("utf-8", "replace")
            return HttpReply(response.status, body, elapsed_ms=(time.monotonic() - started) * 1000)
    except urllib.error.HTTPError as error:
        body = error.read().decode("utf-8", "replace")
        return HttpReply(error.code, body, elapsed_ms=(time.monotonic() - started) * 1000)
    except (urllib.error.URLError, OSError) as error:
        return HttpReply(None, "", describe_url_error(error), (time.monotonic() - started) * 1000)


def server_message(body: str) -> str:
    """The error text in a vLLM/OpenAI error body ({"message"} or {"error": {"message"}}), else the body."""
    try:
        document = json.loads(body)
    except ValueError:
        return excerpt(body)
    if isinstance(document, dict):
        inner = document.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return excerpt(str(inner["message"]))
        if isinstance(inner, str) and inner:
            return excerpt(inner)
        if document.get("message"):
            return excerpt(str(document["message"]))
    return excerpt(body)


def failure_detail(reply: HttpReply) -> str:
    if reply.status is None:
        return f"no response: {reply.error}"
    return f"HTTP {reply.status}: {server_message(reply.body)}"


def response_document(response: Mapping[str, Any] | HttpReply) -> tuple[dict[str, Any] | None, str]:
    """(parsed JSON, "") for a 2xx reply or an already-parsed document; (None, why not) otherwise."""
    if not isinstance(response, HttpReply):
        return (dict(response), "") if isinstance(response, Mapping) else (None, "response is not a JSON object")
    if not response.ok:
        return None, failure_detail(response)
    try:
        document = json.loads(response.body)
    except ValueError:
        return None, f"HTTP {response.status} but the body is not JSON: {excerpt(response.body)}"
    if not isinstance(document, dict):
        return None, f"HTTP {response.status} but the body is not a JSON object: {excerpt(response.body)}"
    return document, ""


# ------------------------------------------------------------------------------------------ health, models


def judge_health(reply: HttpReply) -> CheckResult:
    """GET /health answers 200 once every rank has joined and the engine is up."""
    if reply.ok:
        return passed("health", f"HTTP {reply.status} in {reply.elapsed_ms:.0f} ms")
    return failed("health", f"/health: {failure_detail(reply)}")


def judge_models(models_json: Mapping[str, Any] | HttpReply, served_name: str) -> CheckResult:
    """The served model name must be one of the ids GET /v1/models lists."""
    document, problem = response_document(models_json)
    if document is None:
        return failed("models", f"/v1/models: {problem}")
    entries = document.get("data")
    if not isinstance(entries, list):
        return failed("models", f"/v1/models has no data list: {excerpt(json.dumps(document))}")
    listed = [str(entry.get("id")) for entry in entries if isinstance(entry, dict)]
    if served_name in listed:
        return passed("models", f"{served_name} is served", listed=listed)
    shown = ", ".join(listed) if listed else "nothing"
    return failed(
        "models",
        f"{served_name} is not served: /v1/models lists {shown} (check --served-model-name on rank 0)",
        listed=listed,
    )


# ------------------------------------------------------------------------------------------ tool calls


def tool_choice_value(tool_choice: str) -> str | dict[str, Any]:
    """auto and required are passed as they are; any other value names one of the offered functions."""
    if tool_choice in ("auto", "required"):
        return tool_choice
    if tool_choice not in TOOL_NAMES:
        raise ValueError(f"tool_choice {tool_choice!r} is not auto, required or one of {', '.join(TOOL_NAMES)}")
    return {"type": "function", "function": {"name": tool_choice}}


def build_tool_request(
    model: str, tool_choice: str = "auto", max_tokens: int = 1024, temperature: float = 0.6
) -> dict[str, Any]:
    """A non-streaming chat completion offering TOOLS that asks for get_weather (the vLLM Kimi K2 recipe's smoke test).

    max_tokens leaves room for a thinking model to reason before it calls; 0.6 is Kimi's recommended temperature.
    """
    return {
        "model": model,
        "messages": [{"role": "user", "content": TOOL_PROMPT}],
        "tools": TOOLS,
        "tool_choice": tool_choice_value(tool_choice),
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": False,
    }


def text_tool_call_evidence(text: str) -> list[str]:
    """What in a reply's text looks like a tool call that the server did not parse (empty: nothing does)."""
    evidence = [marker for marker in KIMI_TOOL_MARKERS if marker in text]
    evidence += sorted({f"functions.{match.group(1)}" for match in KIMI_CALL_ID.finditer(text)})
    if TAGGED_CALL.search(text):
        evidence.append("<tool_call>")
    name = JSON_CALL_NAME.search(text)
    if name and JSON_CALL_ARGUMENTS.search(text):
        evidence.append(f'JSON with "name": "{name.group(1)}" and its arguments')
    return evidence


def first_message(document: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """choices[0] and its message, or None when the response has none."""
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, ""
    message = choices[0].get("message")
    return (message if isinstance(message, dict) else None), str(choices[0].get("finish_reason") or "")


def reasoning_text(message: Mapping[str, Any]) -> str:
    """vLLM calls the field reasoning_content, newer releases reasoning; either counts."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def _tool_call_problems(
    calls: list[Any], offered: Sequence[str], wanted: str | None, require_json: bool
) -> tuple[list[str], list[dict[str, Any]]]:
    problems, seen = [], []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            problems.append(f"tool_calls[{index}] has no function object")
            continue
        name, arguments = function.get("name"), function.get("arguments")
        seen.append({"name": name, "arguments": excerpt(str(arguments))})
        if name not in offered:
            problems.append(f"tool_calls[{index}] calls {name!r}, which was not offered ({', '.join(offered)})")
        elif wanted and name != wanted:
            problems.append(f"tool_calls[{index}] calls {name!r}, but tool_choice named {wanted!r}")
        if require_json and not _arguments_are_json(arguments):
            problems.append(f"tool_calls[{index}] ({name}) arguments are not a JSON object: {excerpt(str(arguments))}")
    return problems, seen


def _arguments_are_json(arguments: Any) -> bool:
    if isinstance(arguments, dict):
        return True  # some servers send the object itself rather than a string
    try:
        return isinstance(json.loads(arguments), dict)
    except (TypeError, ValueError):
        return False


def _no_tool_call_detail(message: Mapping[str, Any], finish_reason: str, tool_choice: str, parser: str) -> str:
    content = str(message.get("content") or "")
    evidence = text_tool_call_evidence(content + "\n" + reasoning_text(message))
    if evidence:
        return (
            f"tool calls emitted as text: tool_calls is empty and the call came back in the message text "
            f"({'; '.join(evidence)}); rank 0 needs --enable-auto-tool-choice --tool-call-parser {parser}"
        )
    if finish_reason == "length":
        return "no tool call: the reply hit max_tokens first (finish_reason length); raise max_tokens"
    hint = (
        " (tool_choice auto lets the model answer in prose; 'required' forces a call)" if tool_choice == "auto" else ""
    )
    return f"no tool call: tool_calls is empty and the reply is text: {excerpt(content) or '(empty)'}{hint}"


def judge_tool_call(
    response: Mapping[str, Any] | HttpReply,
    offered_names: Sequence[str] = TOOL_NAMES,
    tool_choice: str = "auto",
    require_json_arguments: bool = True,
    tool_call_parser: str = DEFAULT_TOOL_CALL_PARSER,
) -> CheckResult:
    """Pass only for a structured call: choices[0].message.tool_calls non-empty, every name offered (and the
    named one when tool_choice names a function), every arguments string a JSON object."""
    if isinstance(response, HttpReply) and response.status == 400:
        missing = [flag for flag in AUTO_TOOL_FLAGS if flag in response.body]
        if missing:
            return failed(
                "tool_call",
                f"HTTP 400: vLLM refuses tool_choice {tool_choice!r} because rank 0 runs without "
                f"{' and '.join(missing)}; start it with --enable-auto-tool-choice --tool-call-parser "
                f"{tool_call_parser} (server: {server_message(response.body)})",
                missing_flags=missing,
            )
    document, problem = response_document(response)
    if document is None:
        return failed("tool_call", f"/v1/chat/completions: {problem}")
    message, finish_reason = first_message(document)
    if message is None:
        return failed("tool_call", f"the response has no choices[0].message: {excerpt(json.dumps(document))}")
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        content = str(message.get("content") or "")
        return failed(
            "tool_call",
            _no_tool_call_detail(message, finish_reason, tool_choice, tool_call_parser),
            finish_reason=finish_reason,
            content=excerpt(content),
            text_evidence=text_tool_call_evidence(content + "\n" + reasoning_text(message)),
        )
    wanted = None if tool_choice in ("auto", "required") else tool_choice
    problems, seen = _tool_call_problems(calls, offered_names, wanted, require_json_arguments)
    if problems:
        return failed("tool_call", "; ".join(problems), tool_calls=seen, finish_reason=finish_reason)
    summary = ", ".join(f"{call['name']}({call['arguments']})" for call in seen)
    return passed("tool_call", f"structured tool call: {summary}", tool_calls=seen, finish_reason=finish_reason)


# ------------------------------------------------------------------------------------------ launch flags


def option_values(argv: Sequence[str]) -> dict[str, list[str | None]]:
    """Every --option in argv with the values it was given, in order (None: given without a value).

    --flag=value is split; --flag value takes the next word when it is not itself an option. vLLM's parser
    treats --foo_bar as --foo-bar, so underscores are normalised here too.
    """
    options: dict[str, list[str | None]] = {}
    for index, word in enumerate(argv):
        if not word.startswith("--") or word == "--":
            continue
        name, has_value, value = word.partition("=")
        name = "--" + name[2:].replace("_", "-")
        if not has_value:
            following = argv[index + 1] if index + 1 < len(argv) else None
            value = following if following is not None and not following.startswith("-") else None
        options.setdefault(name, []).append(value)
    return options


def _flag_value_problem(options: dict[str, list[str | None]], flag: str, expected: str) -> str | None:
    values = options.get(flag)
    if not values:
        return f"{flag} is missing (expected {flag} {expected})"
    actual = values[-1]  # argparse keeps the last occurrence
    if actual != expected:
        return f"{flag} is {actual or '(no value)'}, expected {expected}"
    return None


def _auto_tool_choice_problem(options: dict[str, list[str | None]]) -> str | None:
    if "--no-enable-auto-tool-choice" in options:
        return "--no-enable-auto-tool-choice is set (expected --enable-auto-tool-choice)"
    if "--enable-auto-tool-choice" not in options:
        return "--enable-auto-tool-choice is missing"
    return None


def judge_served_flags(argv: Sequence[str], expected: Mapping[str, Any]) -> CheckResult:
    """Rank 0's argv against expected {tool_call_parser, reasoning_parser, enable_auto_tool_choice}; an empty
    parser name or a false enable_auto_tool_choice is not checked."""
    if not argv:
        return failed("served_flags", "no argv for the rank-0 process (is it running?)")
    options = option_values(argv)
    problems = []
    for key, flag in (("tool_call_parser", "--tool-call-parser"), ("reasoning_parser", "--reasoning-parser")):
        if expected.get(key):
            problems.append(_flag_value_problem(options, flag, str(expected[key])))
    if expected.get("enable_auto_tool_choice"):
        problems.append(_auto_tool_choice_problem(options))
    problems = [problem for problem in problems if problem]
    found = {flag: options[flag][-1] for flag in ("--tool-call-parser", "--reasoning-parser") if flag in options}
    found["--enable-auto-tool-choice"] = "--enable-auto-tool-choice" in options
    if problems:
        note = " (argv has --config: flags from that file are not seen here)" if "--config" in options else ""
        return failed("served_flags", "rank 0: " + "; ".join(problems) + note, found=found)
    checked = [flag for flag, value in found.items() if value]
    if not checked:
        return passed("served_flags", "rank 0 runs; no parser flag was expected", found=found)
    return passed(
        "served_flags", "rank 0 runs with " + ", ".join(_flag_text(flag, found) for flag in checked), found=found
    )


def _flag_text(flag: str, found: Mapping[str, Any]) -> str:
    value = found[flag]
    return flag if value is True else f"{flag} {value}"


def argv_from_cmdline(raw: bytes) -> list[str]:
    """/proc/PID/cmdline: NUL-separated words."""
    return [word.decode("utf-8", "replace") for word in raw.split(b"\0") if word]


# ------------------------------------------------------------------------------------------ reasoning


def build_reasoning_request(
    model: str, max_tokens: int = 1024, chat_template_kwargs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A short question a thinking model reasons about; chat_template_kwargs (e.g. {"thinking": true}) is
    passed to vLLM when the chat template needs thinking switched on."""
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": REASONING_PROMPT}],
        "max_tokens": max_tokens,
        "stream": False,
    }
    if chat_template_kwargs:
        request["chat_template_kwargs"] = dict(chat_template_kwargs)
    return request


def judge_reasoning(response: Mapping[str, Any] | HttpReply, reasoning_parser: str = "kimi_k2") -> CheckResult:
    """Pass when the reasoning comes back in its own field and the answer carries no thinking markers."""
    document, problem = response_document(response)
    if document is None:
        return failed("reasoning", f"/v1/chat/completions: {problem}")
    message, finish_reason = first_message(document)
    if message is None:
        return failed("reasoning", f"the response has no choices[0].message: {excerpt(json.dumps(document))}")
    reasoning = reasoning_text(message)
    content = str(message.get("content") or "")
    markers = [marker for marker in THINK_MARKERS if marker in content]
    evidence = {"finish_reason": finish_reason, "content": excerpt(content), "reasoning": excerpt(reasoning)}
    if markers and not reasoning:
        return failed(
            "reasoning",
            f"the reasoning came back inside content ({', '.join(markers)}) and reasoning_content is empty; "
            f"rank 0 needs --reasoning-parser {reasoning_parser}",
            **evidence,
        )
    if markers:
        return failed(
            "reasoning", f"reasoning is split out, but content still carries {', '.join(markers)}", **evidence
        )
    if not reasoning:
        return failed(
            "reasoning",
            "no reasoning_content (or reasoning) in the reply: is the model a thinking model with thinking on, and "
            f"does rank 0 run --reasoning-parser {reasoning_parser}?",
            **evidence,
        )
    return passed("reasoning", f"{len(reasoning)} characters of reasoning, separate from content", **evidence)


# ------------------------------------------------------------------------------------------ all checks


@dataclass
class ApiCheckOptions:
    """What plugins/modules/kimi_verify_api.py passes in (its option names in the comments)."""

    base_url: str  # base_url
    served_model_name: str  # served_model_name
    api_key: str | None = None  # api_key
    tool_choice: str = "auto"  # tool_choice
    require_json_arguments: bool = True  # require_json_arguments
    reasoning: bool = False  # reasoning
    reasoning_skip_reason: str = ""  # reasoning_skip_reason
    reasoning_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    served_argv: list[str] | None = None  # served_argv (or read from served_pid)
    expected_flags: dict[str, Any] = field(default_factory=dict)  # expected_* options
    max_tokens: int = 1024  # max_tokens
    timeout: float = 120.0  # timeout
    # generate_skip_reason: when set, the checks that generate tokens (tool_call, reasoning) are skipped with it.
    generate_skip_reason: str = ""


Fetch = Callable[..., HttpReply]
# The checks that make the model generate tokens (the others read /health, /v1/models and rank 0's argv).
GENERATING_CHECKS = ("tool_call", "reasoning")


def run_api_checks(options: ApiCheckOptions, fetch: Fetch = http_call) -> list[CheckResult]:
    """Every check, in order, whatever the earlier ones returned (a report lists them all)."""
    root, key, timeout = api_root(options.base_url), options.api_key, options.timeout
    tool_parser = str(options.expected_flags.get("tool_call_parser") or DEFAULT_TOOL_CALL_PARSER)
    reasoning_parser = str(options.expected_flags.get("reasoning_parser") or DEFAULT_TOOL_CALL_PARSER)
    results = [
        judge_health(fetch(f"{root}/health", None, key, timeout)),
        judge_models(fetch(f"{root}/v1/models", None, key, timeout), options.served_model_name),
    ]
    if options.served_argv is None:
        results.append(skipped("served_flags", "no rank-0 argv given (served_argv or served_pid)"))
    else:
        results.append(judge_served_flags(options.served_argv, options.expected_flags))
    if options.generate_skip_reason:
        # A converge that changed nothing on a service that already passed a full verify: only what reads runs.
        return [*results, *(skipped(name, options.generate_skip_reason) for name in GENERATING_CHECKS)]
    tool_request = build_tool_request(options.served_model_name, options.tool_choice, options.max_tokens)
    results.append(
        judge_tool_call(
            fetch(f"{root}/v1/chat/completions", tool_request, key, timeout),
            TOOL_NAMES,
            options.tool_choice,
            options.require_json_arguments,
            tool_parser,
        )
    )
    if options.reasoning:
        reasoning_request = build_reasoning_request(
            options.served_model_name, options.max_tokens, options.reasoning_chat_template_kwargs
        )
        reply = fetch(f"{root}/v1/chat/completions", reasoning_request, key, timeout)
        results.append(judge_reasoning(reply, reasoning_parser))
    else:
        results.append(skipped("reasoning", options.reasoning_skip_reason or "reasoning checks are disabled"))
    return results


def failure_summary(results: Sequence[CheckResult]) -> str:
    """One line per failed check, for a module's msg."""
    failures = [result for result in results if result.is_failure]
    lines = [f"{len(failures)} of {len(results)} API checks failed:"]
    lines += [f"- {result.name}: {result.detail}" for result in failures]
    return "\n".join(lines)
