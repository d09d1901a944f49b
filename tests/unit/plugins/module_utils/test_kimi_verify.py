"""API checks: the judges on recorded-shape responses (structured tool call, the vLLM Kimi K2 recipe's "tool
calls emitted as text", vLLM's 400 for auto without the flags, reasoning split), the argv flag check, then every
check against a fake server on 127.0.0.1, and the module end to end."""

from __future__ import annotations

import json

import pytest
from ansible_collections.kimi.k2.plugins.module_utils.kimi_verify import (
    TOOL_NAMES,
    ApiCheckOptions,
    HttpReply,
    build_reasoning_request,
    build_tool_request,
    failure_summary,
    judge_health,
    judge_models,
    judge_reasoning,
    judge_served_flags,
    judge_tool_call,
    option_values,
    run_api_checks,
    skipped,
)

from tests.unit.ansible_adhoc import run_module
from tests.unit.fake_openai import FakeOpenAI, closed_port_url

VLLM_AUTO_400 = json.dumps(
    {
        "object": "error",
        "message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
)
KIMI_TEXT_CALL = (
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Athens"}<|tool_call_end|><|tool_calls_section_end|>'
)


def completion(message: dict, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
    }


def tool_call(name: str = "get_weather", arguments: str = '{"city": "Athens"}') -> dict:
    return {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": arguments}}


STRUCTURED = completion({"content": None, "tool_calls": [tool_call()]}, "tool_calls")


# ------------------------------------------------------------------------------------------ models, health


def test_models_lists_the_served_name_or_says_what_is_listed():
    listed = {"object": "list", "data": [{"id": "kimi-k2"}, {"id": "other"}]}
    assert judge_models(listed, "kimi-k2").passed
    missing = judge_models(listed, "kimi-k2-thinking")
    assert not missing.passed
    assert missing.detail.startswith("kimi-k2-thinking is not served: /v1/models lists kimi-k2, other")
    assert missing.data["listed"] == ["kimi-k2", "other"]
    refused = judge_models(HttpReply(None, "", "connection refused"), "kimi-k2")
    assert refused.detail == "/v1/models: no response: connection refused"
    unauthorised = judge_models(HttpReply(401, '{"error": {"message": "Unauthorized"}}'), "kimi-k2")
    assert unauthorised.detail == "/v1/models: HTTP 401: Unauthorized"


def test_health():
    assert judge_health(HttpReply(200, "", elapsed_ms=3.2)).detail == "HTTP 200 in 3 ms"
    assert judge_health(HttpReply(503, "")).is_failure


# ------------------------------------------------------------------------------------------ tool calls


def test_tool_request_for_each_choice():
    auto = build_tool_request("kimi-k2", "auto", max_tokens=300)
    assert auto["tool_choice"] == "auto" and auto["stream"] is False and auto["max_tokens"] == 300
    assert [tool["function"]["name"] for tool in auto["tools"]] == list(TOOL_NAMES) == ["get_weather", "get_time"]
    for tool in auto["tools"]:
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object" and parameters["required"]
        assert set(parameters["required"]) <= set(parameters["properties"])
    assert build_tool_request("kimi-k2", "required")["tool_choice"] == "required"
    named = build_tool_request("kimi-k2", "get_time")["tool_choice"]
    assert named == {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(ValueError, match="get_weather, get_time"):
        build_tool_request("kimi-k2", "get_stock_price")


def test_a_structured_tool_call_passes():
    result = judge_tool_call(STRUCTURED)
    assert result.passed and result.status == "pass", result.detail
    assert result.detail == 'structured tool call: get_weather({"city": "Athens"})'
    assert result.data["finish_reason"] == "tool_calls"


def test_tool_call_returned_as_kimi_text_is_the_recipes_failure():
    result = judge_tool_call(completion({"content": KIMI_TEXT_CALL, "tool_calls": []}))
    assert result.is_failure
    assert result.detail.startswith("tool calls emitted as text")
    assert "<|tool_call_begin|>" in result.detail and "functions.get_weather" in result.detail
    assert result.detail.endswith("rank 0 needs --enable-auto-tool-choice --tool-call-parser kimi_k2")


def test_tool_call_returned_as_json_text_is_caught_too():
    text = 'Sure: {"name": "get_weather", "arguments": {"city": "Athens"}}'
    result = judge_tool_call(completion({"content": text}))
    assert result.detail.startswith("tool calls emitted as text")
    assert 'JSON with "name": "get_weather"' in result.detail
    # the same text inside the reasoning field (a thinking model whose call never left its reasoning)
    reasoning = judge_tool_call(completion({"content": "", "reasoning_content": "functions.get_time:0 {}"}))
    assert reasoning.detail.startswith("tool calls emitted as text")


def test_prose_without_a_call_is_not_mistaken_for_text_tool_calls():
    result = judge_tool_call(completion({"content": "The weather in Athens is sunny."}))
    assert result.is_failure
    assert result.detail.startswith("no tool call: tool_calls is empty and the reply is text: The weather")
    assert "'required' forces a call" in result.detail
    truncated = judge_tool_call(completion({"content": ""}, "length"))
    assert "hit max_tokens" in truncated.detail


def test_vllm_400_for_auto_without_the_flags_names_them():
    result = judge_tool_call(HttpReply(400, VLLM_AUTO_400))
    assert result.is_failure
    assert "rank 0 runs without --enable-auto-tool-choice and --tool-call-parser" in result.detail
    assert "start it with --enable-auto-tool-choice --tool-call-parser kimi_k2" in result.detail
    assert result.data["missing_flags"] == ["--enable-auto-tool-choice", "--tool-call-parser"]
    other_400 = judge_tool_call(HttpReply(400, '{"message": "max_tokens is too large", "code": 400}'))
    assert other_400.detail == "/v1/chat/completions: HTTP 400: max_tokens is too large"
    newer_error_shape = judge_tool_call(HttpReply(500, '{"error": {"message": "engine dead", "code": 500}}'))
    assert newer_error_shape.detail.endswith("HTTP 500: engine dead")


def test_tool_call_problems_are_each_named():
    invented = judge_tool_call(completion({"tool_calls": [tool_call("get_stock_price", "{}")]}))
    assert invented.detail == "tool_calls[0] calls 'get_stock_price', which was not offered (get_weather, get_time)"
    not_json = judge_tool_call(completion({"tool_calls": [tool_call(arguments="city=Athens")]}))
    assert not_json.detail == "tool_calls[0] (get_weather) arguments are not a JSON object: city=Athens"
    lax = judge_tool_call(
        completion({"tool_calls": [tool_call(arguments="city=Athens")]}), require_json_arguments=False
    )
    assert lax.passed
    wrong_name = judge_tool_call(STRUCTURED, tool_choice="get_time")
    assert wrong_name.detail == "tool_calls[0] calls 'get_weather', but tool_choice named 'get_time'"
    assert judge_tool_call({"choices": []}).detail.startswith("the response has no choices[0].message")
    assert judge_tool_call(HttpReply(200, "not json")).detail.endswith("the body is not JSON: not json")


# ------------------------------------------------------------------------------------------ launch flags

EXPECTED = {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2", "enable_auto_tool_choice": True}


def test_flags_in_both_forms_pass():
    argv = [
        "/opt/vllm/current/bin/python",
        "/opt/vllm/current/bin/vllm",
        "serve",
        "/data/models/kimi",
        "--tool-call-parser",
        "kimi_k2",
        "--reasoning-parser=kimi_k2",
        "--enable-auto-tool-choice",
        "--port",
        "8000",
    ]
    result = judge_served_flags(argv, EXPECTED)
    assert result.passed, result.detail
    assert result.detail == (
        "rank 0 runs with --tool-call-parser kimi_k2, --reasoning-parser kimi_k2, --enable-auto-tool-choice"
    )


def test_missing_and_wrong_flags_are_each_named_with_the_expected_value():
    argv = ["vllm", "serve", "/m", "--reasoning-parser", "deepseek_r1", "--port", "8000"]
    result = judge_served_flags(argv, EXPECTED)
    assert result.detail == (
        "rank 0: --tool-call-parser is missing (expected --tool-call-parser kimi_k2); "
        "--reasoning-parser is deepseek_r1, expected kimi_k2; --enable-auto-tool-choice is missing"
    )


def test_flag_forms_vllm_also_accepts():
    underscores = ["vllm", "serve", "/m", "--tool_call_parser=kimi_k2", "--enable_auto_tool_choice"]
    assert judge_served_flags(underscores, {**EXPECTED, "reasoning_parser": ""}).passed
    last_wins = ["vllm", "serve", "--tool-call-parser", "kimi_k2", "--tool-call-parser", "hermes"]
    assert "--tool-call-parser is hermes" in judge_served_flags(last_wins, {"tool_call_parser": "kimi_k2"}).detail
    negated = ["vllm", "serve", "--tool-call-parser", "kimi_k2", "--no-enable-auto-tool-choice"]
    assert "--no-enable-auto-tool-choice is set" in judge_served_flags(negated, EXPECTED).detail
    no_value = ["vllm", "serve", "--tool-call-parser", "--port", "8000"]
    assert "--tool-call-parser is (no value)" in judge_served_flags(no_value, {"tool_call_parser": "kimi_k2"}).detail


def test_flags_not_expected_are_not_checked_and_an_empty_argv_fails():
    seed_001 = ["vllm", "serve", "/m", "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2"]
    assert judge_served_flags(seed_001, {**EXPECTED, "reasoning_parser": ""}).passed
    assert judge_served_flags([], EXPECTED).detail.startswith("no argv for the rank-0 process")
    assert judge_served_flags(["vllm", "serve", "/m"], {}).detail == "rank 0 runs; no parser flag was expected"
    with_config = judge_served_flags(["vllm", "serve", "--config", "serve.yaml"], EXPECTED)
    assert with_config.detail.endswith("(argv has --config: flags from that file are not seen here)")


def test_option_values_reads_values_and_bare_flags():
    assert option_values(["--a", "1", "--b", "--c=x=y", "pos"]) == {"--a": ["1"], "--b": [None], "--c": ["x=y"]}


# ------------------------------------------------------------------------------------------ reasoning


def test_reasoning_request_passes_template_kwargs_only_when_given():
    assert "chat_template_kwargs" not in build_reasoning_request("kimi-k2")
    request = build_reasoning_request("kimi-k2", 256, {"thinking": True})
    assert request["chat_template_kwargs"] == {"thinking": True} and request["max_tokens"] == 256


def test_reasoning_split_from_content_passes_in_either_field():
    for key in ("reasoning_content", "reasoning"):
        result = judge_reasoning(completion({"content": "391", key: "17 x 23 = 17 x 20 + 17 x 3 = 391"}))
        assert result.passed, result.detail


def test_reasoning_left_in_content_fails_and_names_the_parser():
    for opening, closing in (("<think>", "</think>"), ("◁think▷", "◁/think▷")):
        result = judge_reasoning(completion({"content": f"{opening}17 x 23...{closing}391"}))
        assert result.is_failure
        assert f"came back inside content ({opening}, {closing})" in result.detail
        assert result.detail.endswith("rank 0 needs --reasoning-parser kimi_k2")
    leftover = judge_reasoning(completion({"content": "</think>391", "reasoning_content": "17 x 23"}))
    assert leftover.detail == "reasoning is split out, but content still carries </think>"
    nothing = judge_reasoning(completion({"content": "391"}))
    assert nothing.detail.startswith("no reasoning_content (or reasoning) in the reply")


def test_skipped_is_neither_a_pass_nor_a_failure():
    result = skipped("reasoning", "Kimi-K2-Instruct is not a thinking model")
    assert (result.status, result.passed, result.is_failure) == ("skip", False, False)
    assert result.as_dict()["detail"] == "Kimi-K2-Instruct is not a thinking model"


# ------------------------------------------------------------------------------------------ against a server


def kimi_reply(tool_text: bool = False):
    def reply(body):
        if "tools" not in body:
            return 200, completion({"content": "391", "reasoning_content": "17 x 23 = 391"})
        if tool_text:
            return 200, completion({"content": KIMI_TEXT_CALL, "tool_calls": []})
        return 200, STRUCTURED

    return reply


def options(server_url: str, **extra) -> ApiCheckOptions:
    settings = {"served_model_name": "kimi-k2", "timeout": 5.0}
    settings.update(extra)
    return ApiCheckOptions(server_url, **settings)


def test_all_checks_against_a_healthy_server():
    argv = ["vllm", "serve", "/m", "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2"]
    with FakeOpenAI(reply=kimi_reply()) as server:
        results = run_api_checks(
            options(
                server.url + "/v1/",
                api_key="sk-test",
                served_argv=argv,
                expected_flags={"tool_call_parser": "kimi_k2", "enable_auto_tool_choice": True},
                reasoning=True,
            )
        )
        sent = server.requests
    assert [(r.name, r.status) for r in results] == [
        ("health", "pass"),
        ("models", "pass"),
        ("served_flags", "pass"),
        ("tool_call", "pass"),
        ("reasoning", "pass"),
    ]
    assert [(s["method"], s["path"]) for s in sent] == [
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
    ]
    assert all(s["headers"]["Authorization"] == "Bearer sk-test" for s in sent)
    assert sent[2]["body"]["tool_choice"] == "auto" and "tools" not in sent[3]["body"]


def test_every_check_runs_even_when_earlier_ones_fail():
    with FakeOpenAI(models=("other",), reply=kimi_reply(tool_text=True), health_status=503) as server:
        results = run_api_checks(options(server.url, reasoning_skip_reason="not a thinking model"))
    assert [(r.name, r.status) for r in results] == [
        ("health", "fail"),
        ("models", "fail"),
        ("served_flags", "skip"),
        ("tool_call", "fail"),
        ("reasoning", "skip"),
    ]
    summary = failure_summary(results)
    assert summary.splitlines()[0] == "3 of 5 API checks failed:"
    assert "- tool_call: tool calls emitted as text" in summary
    assert results[4].detail == "not a thinking model"


def test_with_a_generate_skip_reason_nothing_is_generated_and_the_reading_checks_still_run():
    with FakeOpenAI(reply=kimi_reply(tool_text=True)) as server:
        results = run_api_checks(
            options(server.url, reasoning=True, generate_skip_reason="unchanged since its last full verify")
        )
        sent = server.requests
    assert [(r.name, r.status, r.detail) for r in results[2:]] == [
        ("served_flags", "skip", "no rank-0 argv given (served_argv or served_pid)"),
        ("tool_call", "skip", "unchanged since its last full verify"),
        ("reasoning", "skip", "unchanged since its last full verify"),
    ]
    assert [(r.name, r.status) for r in results[:2]] == [("health", "pass"), ("models", "pass")]
    assert [s["path"] for s in sent] == ["/health", "/v1/models"]


def test_an_unreachable_server_fails_every_request_check_without_raising():
    results = run_api_checks(options(closed_port_url(), reasoning=True))
    failures = {r.name: r.detail for r in results if r.is_failure}
    assert failures == {
        "health": "/health: no response: connection refused",
        "models": "/v1/models: no response: connection refused",
        "tool_call": "/v1/chat/completions: no response: connection refused",
        "reasoning": "/v1/chat/completions: no response: connection refused",
    }


# ------------------------------------------------------------------------------------------ the module


def test_module_lists_every_failed_check_and_keeps_the_key_out_of_the_output(tmp_path):
    args = {
        "base_url": "",
        "served_model_name": "kimi-k2",
        "api_key": "sk-verify-secret",
        "served_argv": ["vllm", "serve", "/m", "--port", "8000"],
        "timeout": 5,
    }
    with FakeOpenAI(reply=kimi_reply(tool_text=True)) as server:
        args["base_url"] = server.url
        ok, result = run_module(tmp_path, "kimi_verify_api", args)
        assert server.requests[0]["headers"]["Authorization"] == "Bearer sk-verify-secret"
    assert not ok
    assert result["msg"].splitlines()[0] == "2 of 5 API checks failed:"
    assert (
        "- served_flags: rank 0: --tool-call-parser is missing (expected --tool-call-parser kimi_k2)" in result["msg"]
    )
    assert "- tool_call: tool calls emitted as text" in result["msg"]
    assert [c["status"] for c in result["checks"]] == ["pass", "pass", "fail", "fail", "skip"]
    assert "sk-verify-secret" not in json.dumps(result)


def test_module_collects_without_failing_in_check_mode(tmp_path):
    with FakeOpenAI(reply=kimi_reply(tool_text=True)) as server:
        args = {"base_url": server.url, "served_model_name": "kimi-k2", "fail_on_error": False, "timeout": 5}
        ok, result = run_module(tmp_path, "kimi_verify_api", args, check=True)
        assert len(server.requests) == 3  # it ran in check mode: health, models, the tool call
    assert ok and result["ok"] is False and result["changed"] is False
    assert result["msg"] == "health pass, models pass, served_flags skip, tool_call fail, reasoning skip"


def test_module_fails_the_flags_check_for_a_stopped_unit(tmp_path):
    args = {"base_url": closed_port_url(), "served_model_name": "kimi-k2", "served_pid": 0, "timeout": 2}
    ok, result = run_module(tmp_path, "kimi_verify_api", args)
    assert not ok
    assert "- served_flags: no argv for the rank-0 process (is it running?)" in result["msg"]
    assert result["served_argv"] == []


def test_module_refuses_a_tool_choice_that_names_no_offered_function(tmp_path):
    args = {"base_url": closed_port_url(), "served_model_name": "kimi-k2", "tool_choice": "get_stock_price"}
    ok, result = run_module(tmp_path, "kimi_verify_api", args)
    assert not ok and "tool_choice 'get_stock_price' is not auto, required or one of" in result["msg"]
