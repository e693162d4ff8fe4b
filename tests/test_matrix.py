"""Matrix parsing and expansion: table-driven, including GitHub Actions include/exclude edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.errors import ConfigError
from sweeper.install.matrix_loader import load_matrix, parse_matrix
from sweeper.spec.matrix import expand_combinations
from sweeper.spec.yamlfile import load

A = [("os", ["linux", "windows"]), ("py", ["3.11", "3.12"])]


@pytest.mark.parametrize("axes,exclude,include,expected", [
    # plain product, in axis order
    (A, [], [], [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"},
                 {"os": "windows", "py": "3.11"}, {"os": "windows", "py": "3.12"}]),
    # exclude with a partial match removes every combination it matches
    (A, [{"os": "windows"}], [], [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"}]),
    # exclude needs all its keys to match
    (A, [{"os": "windows", "py": "3.12"}], [], [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"},
                                                {"os": "windows", "py": "3.11"}]),
    # include with only new keys extends every combination
    ([("os", ["linux", "windows"])], [], [{"color": "green"}],
     [{"os": "linux", "color": "green"}, {"os": "windows", "color": "green"}]),
    # include matching an original value extends only those combinations
    (A, [], [{"os": "windows", "npm": 6}], [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"},
                                           {"os": "windows", "py": "3.11", "npm": 6},
                                           {"os": "windows", "py": "3.12", "npm": 6}]),
    # include contradicting every original combination becomes a combination of its own
    (A, [], [{"os": "macos", "py": "3.13"}], [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"},
                                             {"os": "windows", "py": "3.11"}, {"os": "windows", "py": "3.12"},
                                             {"os": "macos", "py": "3.13"}]),
    # a later include may overwrite a value an earlier include added, never an original one
    ([("fruit", ["apple", "pear"])], [], [{"color": "green"}, {"fruit": "apple", "color": "red"}],
     [{"fruit": "apple", "color": "red"}, {"fruit": "pear", "color": "green"}]),
    # GitHub's documented example: includes extend, and an unmatched one is added
    ([("fruit", ["apple", "pear"]), ("animal", ["cat", "dog"])], [],
     [{"color": "green"}, {"color": "pink", "animal": "cat"}, {"fruit": "apple", "shape": "circle"},
      {"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}],
     [{"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
      {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
      {"fruit": "pear", "animal": "cat", "color": "pink"},
      {"fruit": "pear", "animal": "dog", "color": "green"},
      {"fruit": "banana"},
      {"fruit": "banana", "animal": "cat"}]),
    # exclude runs before include: an include can bring an excluded combination back
    (A, [{"os": "windows"}], [{"os": "windows", "py": "3.12"}],
     [{"os": "linux", "py": "3.11"}, {"os": "linux", "py": "3.12"}, {"os": "windows", "py": "3.12"}]),
])
def test_expand_combinations(axes, exclude, include, expected):
    assert expand_combinations(axes, exclude, include) == expected


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "s.yaml").write_text("cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


BASE = "model: m\nsuite: s.yaml\ninstall: {kind: sim}\n"


def test_parsing_reads_no_files_and_the_loader_checks_the_suites(tmp_path):
    path = write(tmp_path, "model: m\nsuite: [s.yaml, nope.yaml]\ninstall: {kind: sim}\naxes: {commit: [v1]}\n")
    data, pos = load(path)
    matrix = parse_matrix(data, pos, str(path))  # the data alone: a suite file missing is no concern yet
    assert [p.name for p in matrix.suite_paths] == ["s.yaml", "nope.yaml"]
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    assert str(err.value) == f"{path}:2: suite[1]: suite file not found: {tmp_path}/nope.yaml"


def test_spec_none_collapses_num_speculative_tokens(tmp_path):
    m = load_matrix(write(tmp_path, BASE + "axes:\n  spec_method: [none, mtp]\n  num_speculative_tokens: [1, 3, 5]\n"))
    methods = [(c.spec_method, c.num_speculative_tokens) for c in m.cells]
    assert methods == [("none", None), ("mtp", 1), ("mtp", 3), ("mtp", 5)]
    assert "num_speculative_tokens" not in m.cells[0].values
    assert m.cells[1].speculative_config({"mtp": {"x": 1}}) == {"method": "mtp", "num_speculative_tokens": 1, "x": 1}


def test_request_axes_share_a_server_and_others_do_not(tmp_path):
    m = load_matrix(write(tmp_path, BASE + "env: {A: '1'}\naxes:\n  commit: [v1, v2]\n"
                                           "  request.temperature: [0, 0.7]\n  env.B: ['0', '1']\n"))
    assert len(m.cells) == 8
    groups = m.groups()
    assert len(groups) == 4
    assert all(len(g.cells) == 2 for g in groups)
    assert {tuple(sorted(c.request.items())) for c in groups[0].cells} == {(("temperature", 0),),
                                                                          (("temperature", 0.7),)}
    assert dict(groups[0].head.env) == {"A": "1", "B": "0"}
    assert len({c.cell_id for c in m.cells}) == 8


def test_cell_ids_are_stable(tmp_path):
    text = BASE + "axes:\n  commit: [v1]\n  spec_method: [mtp]\n  num_speculative_tokens: [4]\n  async_scheduling: [true]\n"
    a = load_matrix(write(tmp_path, text)).cells[0].cell_id
    b = load_matrix(write(tmp_path, text)).cells[0].cell_id
    assert a == b and a.startswith("v1-mtp4-async-")


def test_serve_values_true_false_null(tmp_path):
    m = load_matrix(write(tmp_path, BASE + "serve: {--enforce-eager: true, --x: false}\n"
                                           "axes:\n  serve.--reasoning-parser: [null, qwen3]\n"))
    assert [dict(c.serve) for c in m.cells] == [{"--enforce-eager": True},
                                                 {"--enforce-eager": True, "--reasoning-parser": "qwen3"}]


@pytest.mark.parametrize("text,message", [
    (BASE + "axes:\n  commit: [v1]\nbogus: 1\n",
     ("m.yaml:6: bogus: unknown key; expected one of: name, description, model, suite, install, serve, env, "
      "request, spec_config, gpus_per_cell, repeats, concurrency, timeouts, max_response_mb, axes, exclude, include, design, cost, "
          "adaptive, bench, expect")),
    (BASE + "axes:\n  commit: []\n", "m.yaml:5: axes.commit: empty axis: expected at least one value"),
    (BASE + "axes:\n  colour: [red]\n",
     ("m.yaml:5: axes.colour: unknown axis; expected one of commit, spec_method, num_speculative_tokens, "
      "async_scheduling, attention_backend or env.NAME, serve.--flag, request.field")),
    (BASE + "axes:\n  num_speculative_tokens: [1, zero]\n",
     "m.yaml:5: axes.num_speculative_tokens[1]: expected a positive integer, got 'zero'"),
    (BASE + "axes:\n  commit: [v1]\n  async_scheduling: [yes-please]\n",
     "m.yaml:6: axes.async_scheduling[0]: expected true, false or null (the version's default), got 'yes-please'"),
    (BASE + "axes:\n  commit:\n    - 0012345\n",
     "m.yaml:6: axes.commit[0]: expected a commit, tag or branch as a string (quote shas and versions), got 5349"),
    (BASE + "axes:\n  commit: [v1\n", "m.yaml:6: invalid YAML: did not find expected ',' or ']'"),
    (BASE + "gpus_per_cell: -1\naxes:\n  commit: [v1]\n",
     "m.yaml:4: gpus_per_cell: Input should be greater than or equal to 0, got -1"),
    (BASE + "max_response_mb: 0\naxes:\n  commit: [v1]\n",
     "m.yaml:4: max_response_mb: Input should be greater than 0, got 0"),
    ("model: m\nsuite: s.yaml\ninstall: {kind: docker}\naxes:\n  commit: [v1]\n",
     "m.yaml:3: install.kind: expected one of 'sim', 'preinstalled', 'wheels', 'source' or 'pip', got 'docker'"),
    (BASE + "axes:\n  commit: [v1]\nexclude:\n  - {spec_method: mtp}\n",
     "m.yaml:7: exclude[0].spec_method: not an axis of this matrix; axes: commit"),
    (BASE + "axes:\n  commit: [v1]\nexclude:\n  - {commit: v1}\n",
     "m.yaml:6: exclude: every combination is excluded: the matrix has no cells"),
    ("model: m\nsuite: nope.yaml\ninstall: {kind: sim}\naxes:\n  commit: [v1]\n", "m.yaml:2: suite: suite file not found: {d}/nope.yaml"),
    ("suite: s.yaml\ninstall: {kind: sim}\naxes:\n  commit: [v1]\n", "m.yaml:1: model: required key is missing"),
    # Nothing defaults to the simulator: a real matrix that forgot `install` must not run it.
    ("model: m\nsuite: s.yaml\naxes:\n  commit: [v1]\n",
     "m.yaml:1: install: required (kind: sim, preinstalled, wheels, source, pip); nothing defaults to the simulator"),
    ("model: m\nsuite: s.yaml\ninstall: {repo: x}\naxes:\n  commit: [v1]\n",
     "m.yaml:3: install.kind: required: one of sim, preinstalled, wheels, source, pip"),
    (BASE + "axes:\n  serve.reasoning-parser: [a]\n",
     "m.yaml:5: axes.serve.reasoning-parser: serve axes name a flag: expected serve.--flag-name"),
    (BASE + "axes:\n  commit: [v1, v1]\n", "m.yaml:5: axes.commit[1]: duplicate value 'v1'"),
])
def test_bad_matrix_names_file_line_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_matrix(path)
    assert str(info.value) == f"{tmp_path}/" + message.format(d=tmp_path)


def test_shipped_matrices_load():
    root = Path(__file__).parent.parent / "matrices"
    demo = load_matrix(root / "demo.yaml")
    assert len(demo.cells) >= 24
    # The demo itself shows server reuse: its request axis puts two cells on every server.
    assert len(demo.cells) == 2 * len(demo.groups())
    assert all(load_matrix(path).spec.install.kind for path in root.glob("*.yaml"))
    assert {c.spec_method for c in demo.cells} >= {"none", "mtp"}
    thor = load_matrix(root / "thor.yaml")
    assert thor.spec.install.kind == "wheels"


def test_cell_ids_keep_every_varying_value_escaped_not_dropped():
    demo = load_matrix(Path(__file__).parent.parent / "matrices" / "demo.yaml")
    by_values = {(c.commit, c.spec_method, c.env.get("VLLM_USE_V2_MODEL_RUNNER"), c.request.get("temperature")):
                 c.cell_id for c in demo.cells}
    assert by_values[("v0.27.0", "none", "0", 0)] == "v0.27.0-none-USE_V2_MODEL_RUNNER=0-temperature=0-360319"
    assert by_values[("v0.27.0", "none", "1", 0)] == "v0.27.0-none-USE_V2_MODEL_RUNNER=1-temperature=0-63e360"
    assert by_values[("v0.28.0~3", "mtp", "1", 0.6)].startswith("v0.28.0~3-mtp4-USE_V2_MODEL_RUNNER=1-temperature=0.6-")
    # Runs written before keep their names: a resumed one finds its groups under them.
    (group,) = [g for g in demo.groups() if len(g.cells) == 2 and g.head.commit == "v0.28.0~3"][:1]
    assert group.legacy_group_id.startswith("v0.28.03-") and group.group_id.startswith("v0.28.0~3-")


def test_cell_ids_escape_what_a_file_name_cannot_hold_and_stay_short(tmp_path):
    long_value = "x" * 200
    text = BASE + ("axes:\n  commit: [pr/12, 'v1^2']\n  spec_method: [none]\n"
                   f"  env.VLLM_SOME_VERY_LONG_VARIABLE_NAME_FOR_A_TEST: ['{long_value}', '{long_value}y']\n"
                   "  serve.--max-model-len: [4096, 8192]\n  request.chat_template_kwargs: [{enable_thinking: true}]\n")
    cells = load_matrix(write(tmp_path, text)).cells
    ids = {c.cell_id for c in cells}
    assert len(ids) == len(cells) == 8
    assert all(len(i) <= 130 and "/" not in i and " " not in i for i in ids)
    assert any(i.startswith("pr%2F12-none-") for i in ids) and any(i.startswith("v1%5E2-none-") for i in ids)
    # Every value is there, the long ones cut with their own hash: 200 x's and 200 x's + y differ.
    assert len({i.split("-")[2] for i in ids}) == 2
    assert all("max-model-len=4096" in i or "max-model-len=8192" in i or "mml=4096" in i or "mml=8192" in i
               for i in ids)


def test_a_secret_axis_value_never_names_a_file(tmp_path):
    text = BASE + "axes:\n  commit: [v1]\n  spec_method: [none]\n  env.HF_TOKEN: [hf_PlantedSecretToken0123456789]\n"
    (cell,) = load_matrix(write(tmp_path, text)).cells
    assert "hf_Planted" not in cell.cell_id and "HF_TOKEN=" in cell.cell_id
