"""Ansible callback: what a check-mode run would change, as JSON lines, for the drift report.

playbooks/drift.yml starts `site.yml --check --diff --tags stack,serve` with this callback enabled and reads
the file back with the kimi_drift_report module. The console output of that run is meant for people; this
file is meant for a program, so every changed result is kept with its host, task, role and diff, whatever
the stdout callback prints.

Inert unless enabled (CALLBACK_NEEDS_ENABLED) and given a file: ansible.cfg only makes it findable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from ansible import context
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: kimi_drift_changes
type: aggregate
short_description: Record every result a (check-mode) run would change, as JSON lines
description:
  - Writes one JSON object per line to I(changes_file). The first line (C(kind=start)) carries the run id,
    the last (C(kind=stats)) the per-host counts, so a reader can tell a finished run from one cut short.
  - C(kind=change) for each changed result (each changed loop item), with its diff; C(kind=would_run) for a
    command that check mode skipped but a real run would execute; C(kind=unchecked) for a task whose module
    cannot run in check mode; C(kind=failed) and C(kind=unreachable) for failures.
  - A result hidden by C(no_log) is recorded without any of its content (no diff, no message, no command),
    only with its task and the file its C(dest) or C(path) argument names.
  - Inert unless enabled (C(ANSIBLE_CALLBACKS_ENABLED=kimi_drift_changes)) and I(changes_file) is set.
requirements:
  - enabled in callbacks_enabled
options:
  changes_file:
    description: The JSON-lines file to write (truncated when the playbook starts).
    type: path
    env:
      - name: KIMI_DRIFT_CHANGES
  run_id:
    description: An opaque id written into the first line, so the reader knows the file is from its run.
    type: str
    default: ""
    env:
      - name: KIMI_DRIFT_RUN_ID
"""

SCHEMA = 1
# A diff holds whole files; Ansible itself skips diffs of files over ~100 KB. Anything longer than this is
# cut (and says so) so one odd file cannot make the record unreadable.
MAX_TEXT = 65536
# Lines of stdout/stderr kept from a failed task: the end is where the reason is.
TAIL_LINES = 25
MAX_LABEL = 200
WOULD_RUN = re.compile(r"would have run", re.IGNORECASE)
NO_CHECK_MODE = re.compile(r"(does not|not) support(ed)? (for this|check mode)|check mode is not supported", re.I)
DIFF_KEYS = ("before", "after", "before_header", "after_header", "prepared", "src_binary", "dst_binary")


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + f"\n[... cut: {len(value) - MAX_TEXT} more characters]\n"
    return value


def _tail(text: Any) -> list[str]:
    if not isinstance(text, str) or not text:
        return []
    return text.splitlines()[-TAIL_LINES:]


def is_censored(result: Mapping[str, Any]) -> bool:
    """no_log results reach callbacks already censored; the flag is checked as well in case one is not."""
    return bool(result.get("_ansible_no_log")) or "censored" in result


def diffs_of(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The result's diff as a list of entries (modules return one dict, a list of them, or nothing)."""
    raw = result.get("diff")
    entries = raw if isinstance(raw, list) else [raw] if isinstance(raw, dict) else []
    kept = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        slim = {key: _cut(entry[key]) for key in DIFF_KEYS if key in entry}
        if slim:
            kept.append(slim)
    return kept


def item_label(result: Mapping[str, Any]) -> str | None:
    if "_ansible_item_label" in result:
        label = result["_ansible_item_label"]
    elif "item" in result:
        label = result["item"]
    else:
        return None
    text = label if isinstance(label, str) else json.dumps(label, sort_keys=True, default=str)
    return text[:MAX_LABEL]


def classify_result(result: Mapping[str, Any], skipped: bool = False) -> str | None:
    """change, would_run, unchecked, or None for a result that says nothing about drift.

    Callbacks get a result without its `skipped`/`failed` keys (the event says it), so the caller passes
    `skipped` for a top-level result; loop items keep their own keys.
    """
    if skipped or result.get("skipped"):
        if "skip_reason" in result or "false_condition" in result or "skipped_reason" in result:
            return None  # a `when:` that was false, or an empty loop: a real run would not act either
        message = str(result.get("msg", ""))
        if WOULD_RUN.search(message):
            return "would_run"
        if NO_CHECK_MODE.search(message):
            return "unchecked"
        return None
    if result.get("changed"):
        return "change"
    return None


def target_path(result: Mapping[str, Any], args: Mapping[str, Any] | None) -> str | None:
    """The file a result is about: the module's dest/path, else the task's own (templated) argument.

    A template or copy that would change reports neither in check mode, and a no_log task reports nothing;
    the task's argument still names the file (a path is not the content, so it is kept for those too).
    """
    for source in (result, args or {}):
        for key in ("dest", "path"):
            value = source.get(key)
            if isinstance(value, str) and value and "{{" not in value:
                return value
    return None


def content_fields(result: Mapping[str, Any], kind: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What is kept of one (item) result: only the file it names when it is censored."""
    path = target_path({} if is_censored(result) else result, args)
    fields: dict[str, Any] = {"censored": is_censored(result)}
    if path:
        fields["path"] = path
    if fields["censored"]:
        return fields
    diffs = diffs_of(result)
    if diffs:
        fields["diff"] = diffs
    message = result.get("msg")
    if isinstance(message, str) and message:
        fields["msg"] = _cut(message)
    command = result.get("cmd")
    if command and kind in ("would_run", "failed"):
        fields["cmd"] = command if isinstance(command, str) else " ".join(str(word) for word in command)
    if kind == "failed":
        for key in ("rc",):
            if key in result:
                fields[key] = result[key]
        for key in ("stdout", "stderr", "module_stderr", "module_stdout"):
            tail = _tail(result.get(key))
            if tail:
                fields[f"{key}_tail"] = tail
    return fields


def path_results(result: Mapping[str, Any], args: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """A task that writes several files in one module run (kimi.k2.kimi_files) as one result per file it changed,
    each with that file's diff entries, so drift names and classifies every file like a template's. A censored
    one (no_log) names the files its arguments list, never their content."""
    paths = result.get("changed_paths")
    if is_censored(result):
        entries = (args or {}).get("files")
        if not isinstance(entries, list):
            return None
        dests = [entry["dest"] for entry in entries if isinstance(entry, dict) and isinstance(entry.get("dest"), str)]
        return [{"changed": True, "path": ", ".join(dests), "censored": True}] if dests else None
    if not isinstance(paths, list) or not paths:
        return None
    entries = diffs_of(result)

    def about(entry: Mapping[str, Any], path: str) -> bool:
        before = entry.get("before")
        return entry.get("after_header") == path or (isinstance(before, dict) and before.get("path") == path)

    return [
        {"changed": True, "path": path, "diff": [entry for entry in entries if about(entry, path)]}
        for path in paths
        if isinstance(path, str)
    ]


def loop_items(result: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    items = result.get("results")
    if isinstance(items, list) and items and all(isinstance(item, dict) for item in items):
        return items
    return None


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "kimi_drift_changes"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display: Any = None) -> None:
        super().__init__(display)
        self._handle: TextIO | None = None
        self._started = False
        self._play = ""
        self._warned = False

    # ---------------------------------------------------------------- the file

    def _path(self) -> str | None:
        path = self.get_option("changes_file")
        if not path and not self._warned:
            self._warned = True
            self._display.warning(
                "kimi_drift_changes is enabled, but KIMI_DRIFT_CHANGES names no file: nothing is recorded"
            )
        return path or None

    def _write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        self._handle.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        # Line by line: a run that dies half-way still leaves everything it saw.
        self._handle.flush()

    def v2_playbook_on_start(self, playbook: Any) -> None:
        path = self._path()
        if path is None:
            return
        # A second playbook on the same command line appends; the first truncates an older run's file.
        self._handle = open(path, "a" if self._started else "w", encoding="utf-8")  # noqa: SIM115
        self._started = True
        self._write(
            {
                "kind": "start",
                "schema": SCHEMA,
                "run_id": self.get_option("run_id") or "",
                "playbook": getattr(playbook, "_file_name", None),
                "check_mode": bool(context.CLIARGS.get("check")),
                "diff_mode": bool(context.CLIARGS.get("diff")),
                "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._play = play.get_name()

    # ---------------------------------------------------------------- results

    def _base(self, result: Any) -> dict[str, Any]:
        task = result.task
        role = getattr(task, "_role", None)
        return {
            "host": result.host.get_name(),
            "play": self._play,
            "role": role.get_name() if role is not None else None,
            "task": result.task_name,
            "action": getattr(task, "resolved_action", None) or task.action,
            "handler": type(task).__name__ == "Handler",
        }

    def _item_records(self, result: Any, skipped: bool = False, failed: bool = False) -> Iterator[dict[str, Any]]:
        data = result.result
        base = self._base(result)
        # The task's templated arguments (what the worker ran); only dest/path are ever read from them.
        args = result.task_fields.get("args") if isinstance(result.task_fields.get("args"), dict) else None
        items = loop_items(data)
        censored_loop = is_censored(data)
        per_path = path_results(data, args) if not (skipped or failed) and data.get("changed") else None
        if items is None and per_path:
            for path_result in per_path:
                fields = content_fields(path_result, "change", {"path": path_result["path"]})
                yield {"kind": "change", **base, "item": None, **fields}
            return
        if items is None:
            kind = "failed" if failed else classify_result(data, skipped=skipped)
            if kind:
                yield {"kind": kind, **base, "item": None, **content_fields(data, kind, args)}
            return
        # One line per loop item: the aggregate only says that something changed or failed.
        for item in items:
            kind = "failed" if item.get("failed") else classify_result(item)
            if not kind:
                continue
            fields = {"censored": True} if censored_loop else content_fields(item, kind)
            label = None if fields["censored"] else item_label(item)
            yield {"kind": kind, **base, "item": label, **fields}
        if failed and not any(item.get("failed") for item in items):
            yield {"kind": "failed", **base, "item": None, **content_fields(data, "failed")}

    def v2_runner_on_ok(self, result: Any) -> None:
        for record in self._item_records(result):
            self._write(record)

    def v2_runner_on_skipped(self, result: Any) -> None:
        for record in self._item_records(result, skipped=True):
            self._write(record)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        for record in self._item_records(result, failed=True):
            if record["kind"] == "failed":
                record["ignored"] = bool(ignore_errors)
            self._write(record)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        data = result.result
        message = "" if is_censored(data) else _cut(str(data.get("msg", "")))
        self._write({"kind": "unreachable", **self._base(result), "item": None, "msg": message})

    def v2_playbook_on_stats(self, stats: Any) -> None:
        hosts = {host: stats.summarize(host) for host in sorted(stats.processed)}
        self._write({"kind": "stats", "hosts": hosts})
        if self._handle is not None:
            self._handle.close()
            self._handle = None
