"""The lab's Hugging Face mirror: a miniature Kimi-K2-shaped checkpoint as a git repository for olah.

Two cache kinds:
- cache/tools/<key>/venv: a venv with the host-side tools pinned in lab/requirements-tools.txt (olah 0.5.4,
  the hf client, tokenizers, safetensors, numpy). Its python runs olah and the checkpoint generator.
- cache/hf/<key>/mirrors/models/kimi-lab/Kimi-K2-mini: the checkpoint, committed with fixed names and dates
  so its commit sha is the same on every machine that builds the same recipe. olah's offline mode serves
  every git repository under MIRRORS/{models,datasets,spaces}/ORG/REPO.

The checkpoint itself is made by lab/mirrors/hf/generate_checkpoint.py (run with the tools python); see
lab/mirrors/README.md for what it contains and how its weights end replies early.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

from labctl import _cache

REPO_ORG = "kimi-lab"
REPO_NAME = "Kimi-K2-mini"
REPO_ID = f"{REPO_ORG}/{REPO_NAME}"
TOOLS_REQUIREMENTS = _cache.MIRRORS_RECIPES.parent / "requirements-tools.txt"
HF_RECIPES = _cache.MIRRORS_RECIPES / "hf"
GENERATOR = HF_RECIPES / "generate_checkpoint.py"
# The miniature's Kimi-K2-shaped config (docs/lab-measurements.md), committed in the repository so a fresh clone builds
# the lab on its own. KIMI_LAB_MODEL_CONFIG overrides where to find it.
DEFAULT_MODEL_CONFIG = _cache.MIRRORS_RECIPES / "hf" / "config.json"
# Fixed identity and time of the one commit, so the sha depends only on the files.
COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "Kimi lab",
    "GIT_AUTHOR_EMAIL": "kimi-lab@localhost.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "Kimi lab",
    "GIT_COMMITTER_EMAIL": "kimi-lab@localhost.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
}
COMMIT_MESSAGE = "Kimi-K2-mini: lab miniature checkpoint (no real knowledge)"


def model_config_path() -> Path:
    path = Path(os.environ.get("KIMI_LAB_MODEL_CONFIG", DEFAULT_MODEL_CONFIG))
    if not path.is_file():
        raise _cache.MirrorBuildError(
            f"model config not found at {path} (set KIMI_LAB_MODEL_CONFIG to tiny-kimi-k2-config.json)"
        )
    return path


# ---------------------------------------------------------------------------------------------- tools venv


def base_python() -> str:
    """The real interpreter behind this one (venvs are made from it, even when labctl runs in a venv)."""
    # Resolved, so that python3 and python3.11 of one installation share one tools venv.
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def tools_key() -> str:
    # A venv belongs to its base interpreter: another Python gets another venv.
    return _cache.recipe_key([TOOLS_REQUIREMENTS], extra=f"python {sys.version} {base_python()}")


def _pip_env() -> dict[str, str]:
    """Host pip settings stay (the registry, certificates); a venv of pinned tools needs no find-links."""
    return dict(os.environ)


def build_tools_venv(cache: Path) -> Path:
    """The tools venv's python (cache/tools/<key>/venv/bin/python), built once per requirements file."""

    def build(entry: Path) -> None:
        venv = entry / "venv"
        _cache.run([base_python(), "-m", "venv", str(venv)], what="python -m venv (lab tools)")
        _cache.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(TOOLS_REQUIREMENTS)],
            env=_pip_env(),
            what="pip install -r lab/requirements-tools.txt",
        )

    # The venv embeds its own absolute path: build it where it will stay. cached_build renames the
    # temporary directory, so build in place under a lock instead.
    entry = Path(cache) / "tools" / tools_key()
    return _cache.cached_build_in_place(entry, build) / "venv" / "bin" / "python"


# --------------------------------------------------------------------------------------------- checkpoint


def recipe_files() -> list[Path]:
    return [
        model_config_path(),
        TOOLS_REQUIREMENTS,
        *sorted(p for p in HF_RECIPES.iterdir() if p.is_file()),
        Path(__file__),
        Path(_cache.__file__),
    ]


def repo_dir(mirrors_path: Path) -> Path:
    """Where olah's offline mode looks for the repository (MIRRORS/models/ORG/REPO)."""
    return mirrors_path / "models" / REPO_ORG / REPO_NAME


def commit_repository(repo: Path, message: str = COMMIT_MESSAGE, git_options: Sequence[str] = ()) -> str:
    """`git init` + one commit of everything in `repo` with the fixed identity; returns the commit sha.

    `git_options` are extra `-c name=value` pairs (the bulk checkpoint turns compression off with them).
    """
    env = {**os.environ, **COMMIT_ENV, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", *git_options]
    _cache.run([*git, "init", "-q", "-b", "main"], env=env, what="git init (checkpoint)")
    _cache.run([*git, "add", "-A"], env=env, what="git add (checkpoint)")
    _cache.run([*git, "commit", "-q", "-m", message], env=env, what="git commit (checkpoint)")
    return _cache.run([*git, "rev-parse", "HEAD"], env=env, what="git rev-parse").stdout.strip()


def expected_tensor_shapes(config: dict) -> dict[str, list[int]]:
    """Every tensor vLLM's DeepseekV3 loader expects for `config`, with its shape (derived independently of
    the generator, so the build can check the generator against it)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    q_rank, kv_rank = config["q_lora_rank"], config["kv_lora_rank"]
    shapes = {
        "model.embed_tokens.weight": [config["vocab_size"], hidden],
        "model.norm.weight": [hidden],
        "lm_head.weight": [config["vocab_size"], hidden],
    }

    def mlp(prefix: str, intermediate: int) -> None:
        shapes[f"{prefix}.gate_proj.weight"] = [intermediate, hidden]
        shapes[f"{prefix}.up_proj.weight"] = [intermediate, hidden]
        shapes[f"{prefix}.down_proj.weight"] = [hidden, intermediate]

    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes[f"{p}.input_layernorm.weight"] = [hidden]
        shapes[f"{p}.post_attention_layernorm.weight"] = [hidden]
        shapes[f"{p}.self_attn.q_a_proj.weight"] = [q_rank, hidden]
        shapes[f"{p}.self_attn.q_a_layernorm.weight"] = [q_rank]
        shapes[f"{p}.self_attn.q_b_proj.weight"] = [heads * (nope + rope), q_rank]
        shapes[f"{p}.self_attn.kv_a_proj_with_mqa.weight"] = [kv_rank + rope, hidden]
        shapes[f"{p}.self_attn.kv_a_layernorm.weight"] = [kv_rank]
        shapes[f"{p}.self_attn.kv_b_proj.weight"] = [heads * (nope + v_dim), kv_rank]
        shapes[f"{p}.self_attn.o_proj.weight"] = [hidden, heads * v_dim]
        if layer < config["first_k_dense_replace"] or layer % config["moe_layer_freq"] != 0:
            mlp(f"{p}.mlp", config["intermediate_size"])
            continue
        shapes[f"{p}.mlp.gate.weight"] = [config["n_routed_experts"], hidden]
        shapes[f"{p}.mlp.gate.e_score_correction_bias"] = [config["n_routed_experts"]]
        for expert in range(config["n_routed_experts"]):
            mlp(f"{p}.mlp.experts.{expert}", config["moe_intermediate_size"])
        mlp(f"{p}.mlp.shared_experts", config["moe_intermediate_size"] * config["n_shared_experts"])
    return shapes


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data_offsets), without metadata."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return header


def check_weights(repo: Path, config: dict) -> None:
    """The generated weights must have exactly the tensors and shapes the loader expects."""
    header = read_safetensors_header(repo / "model.safetensors")
    actual = {name: info["shape"] for name, info in header.items()}
    expected = expected_tensor_shapes(config)
    if actual != expected:
        missing = sorted(set(expected) - set(actual))[:5]
        extra = sorted(set(actual) - set(expected))[:5]
        wrong = sorted(n for n in set(actual) & set(expected) if actual[n] != expected[n])[:5]
        raise _cache.MirrorBuildError(
            f"model.safetensors does not match the config: missing {missing}, extra {extra}, wrong shape {wrong}"
        )


def _build_checkpoint(entry: Path, tools_python: Path) -> None:
    repo = repo_dir(entry / "mirrors")
    repo.mkdir(parents=True)
    _cache.run(
        [str(tools_python), str(GENERATOR), "--config", str(model_config_path()), "--out", str(repo)],
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"},
        what="generate_checkpoint.py",
    )
    check_weights(repo, json.loads(model_config_path().read_text()))
    sha = commit_repository(repo)
    files = {p.name: p.stat().st_size for p in sorted(repo.iterdir()) if p.is_file()}
    manifest = {"repo_id": REPO_ID, "revision": sha, "files": files, "total_bytes": sum(files.values())}
    (entry / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _result(entry: Path, tools_python: Path) -> dict:
    manifest = json.loads((entry / "manifest.json").read_text())
    return {
        "mirrors_path": entry / "mirrors",
        "repo_id": manifest["repo_id"],
        "revision": manifest["revision"],
        "files": manifest["files"],
        "total_bytes": manifest["total_bytes"],
        "olah_python": tools_python,
    }


def build(cache: Path) -> dict:
    """Build (or reuse) the tools venv and the checkpoint mirror; see the module docstring for the layout."""
    tools_python = build_tools_venv(Path(cache))
    key = _cache.recipe_key(recipe_files(), extra=tools_key())
    entry = _cache.cached_build(Path(cache) / "hf", key, lambda tmp: _build_checkpoint(tmp, tools_python))
    return _result(entry, tools_python)


def existing_tools_python(cache: Path) -> Path | None:
    """The tools venv's python when it is built for this interpreter under `cache`, else None; never builds."""
    tools_entry = Path(cache) / "tools" / tools_key()
    return tools_entry / "venv" / "bin" / "python" if _cache.is_complete(tools_entry) else None


def existing(cache: Path) -> dict | None:
    """build()'s result when the current recipe is already built under `cache`, else None; never builds."""
    tools_python = existing_tools_python(cache)
    entry = Path(cache) / "hf" / _cache.recipe_key(recipe_files(), extra=tools_key())
    if tools_python is None or not _cache.is_complete(entry):
        return None
    return _result(entry, tools_python)


# ------------------------------------------------------------------------------------------- olah config


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid TOML basic string


def olah_config(mirrors_path: Path | Sequence[Path], host: str, port: int, repos_path: Path) -> str:
    """olah 0.5.4 TOML config: offline, serving the git repositories under `mirrors_path` (one directory, or
    several: the lab adds the bulk checkpoints' directory, labctl.mirrors_hf_bulk).

    Start it with `OLAH_PYTHON -m olah.server --config FILE --log-path DIR` (olah-cli takes the same
    arguments; the log directory is a command-line option only). `repos_path` is olah's own cache folder.
    """
    netloc = f"{host}:{port}"
    mirrors = [mirrors_path] if isinstance(mirrors_path, str | os.PathLike) else list(mirrors_path)
    lines = [
        "# Written by labctl.mirrors_hf: olah in offline mode serves only the local mirrors below.",
        "[basic]",
        f"host = {_toml_string(host)}",
        f"port = {int(port)}",
        'mirror-scheme = "http"',
        # The address clients use; olah puts it into the URLs it hands out.
        f"mirror-netloc = {_toml_string(netloc)}",
        f"mirror-lfs-netloc = {_toml_string(netloc)}",
        f"repos-path = {_toml_string(str(repos_path))}",
        f"mirrors-path = [{', '.join(_toml_string(str(path)) for path in mirrors)}]",
        "",
        "[accessibility]",
        "offline = true",
        "",
    ]
    return "\n".join(lines)
