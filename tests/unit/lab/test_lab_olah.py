"""tests.lab_olah.resolve_counts: how often each file was fetched, read from olah's uvicorn access lines."""

from __future__ import annotations

from tests.lab_olah import resolve_counts

REPO = "kimi-lab/Kimi-K2-bulk-1GiB"
SHA = "477de9480884c9fb1e3eedeb894249468cba6da9"
PREFIX = "2026-12-06 08:10:41 | INFO | stdout | INFO:     198.18.0.11:59024 - "


def line(method: str, path: str, status: str = "200 OK") -> str:
    return f'{PREFIX}"{method} {path} HTTP/1.1" {status}\n'


def test_counts_get_resolve_lines_per_file():
    log = (
        "2026-12-06 08:10:07 | ERROR | stderr | INFO:     Application startup complete.\n"
        + line("GET", f"/api/models/{REPO}/revision/{SHA}")
        + line("HEAD", f"/{REPO}/resolve/{SHA}/model-00001-of-00002.safetensors")
        + line("GET", f"/{REPO}/resolve/{SHA}/model-00001-of-00002.safetensors")
        + line("GET", f"/{REPO}/resolve/{SHA}/model-00002-of-00002.safetensors")
        + line("GET", f"/{REPO}/resolve/main/model-00001-of-00002.safetensors")
        + line("GET", f"/{REPO}/resolve/{SHA}/config.json")
    )
    assert resolve_counts(log, REPO) == {
        "model-00001-of-00002.safetensors": 2,
        "model-00002-of-00002.safetensors": 1,
        "config.json": 1,
    }


def test_only_answered_gets_of_this_repository_count():
    log = (
        line("HEAD", f"/{REPO}/resolve/{SHA}/config.json")
        + line("GET", f"/{REPO}/resolve/{SHA}/config.json", "404 Not Found")
        + line("GET", f"/{REPO}/resolve/{SHA}/config.json", "500 Internal Server Error")
        + line("GET", f"/kimi-lab/Kimi-K2-mini/resolve/{SHA}/config.json")
        + line("GET", f"/{REPO}2/resolve/{SHA}/config.json")
        + line("GET", f"/{REPO}/resolve/{SHA}/")
        + line("GET", f"/{REPO}/tree/{SHA}/config.json")
    )
    assert resolve_counts(log, REPO) == {}
    assert resolve_counts("", REPO) == {}


def test_redirects_the_models_prefix_query_strings_and_quoted_names_count():
    log = (
        line("GET", f"/{REPO}/resolve/{SHA}/config.json", "302 Found")
        + line("GET", f"/models/{REPO}/resolve/{SHA}/config.json")
        + line("GET", f"/{REPO}/resolve/{SHA}/sub/dir/my%20file.json?download=true")
    )
    assert resolve_counts(log, REPO) == {"config.json": 2, "sub/dir/my file.json": 1}
