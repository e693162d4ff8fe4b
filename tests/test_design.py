"""Covering designs, checked by enumeration: every T-way combination of server-axis values that a
cell of the expanded matrix holds is held by a chosen cell, every chosen cell is one of the matrix's
(nothing its exclude rules remove), and each chosen server runs all of its request-axis cells.

The enumeration here is written apart from `sweeper.plan.design`'s own, so a fault there is not
repeated in the check."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from sweeper.install.matrix_loader import load_matrix
from sweeper.plan.design import Design, choose
from sweeper.spec.matrix import Cell, DesignSpec, Matrix, canonical

ROOT = Path(__file__).resolve().parent.parent
SUITE = "cases: [{id: a, body: {messages: [{role: user, content: hi}]}}]\n"
HEAD = 'model: m\nsuite: s.yaml\ninstall: {kind: sim, repo: "sim:demo"}\n'

# Exclude rules on several axes and a collapsed axis (no num_speculative_tokens without a method).
THOR_LIKE = HEAD + """
axes:
  commit: [a, b, c]
  spec_method: [none, mtp, ngram]
  num_speculative_tokens: [1, 4]
  env.VLLM_USE_V2_MODEL_RUNNER: ["0", "1"]
  attention_backend: [FLASHINFER, FLASH_ATTN]
  serve.--max-model-len: [262144, 32768]
exclude:
  - {spec_method: ngram, env.VLLM_USE_V2_MODEL_RUNNER: "1"}
  - {commit: a, spec_method: mtp, attention_backend: FLASH_ATTN}
  - {commit: c, serve.--max-model-len: 32768, num_speculative_tokens: 4}
"""
# Includes: one extends the mtp cells with a key of its own, one stands alone with values no axis has.
INCLUDES = HEAD + """
axes:
  env.A: [a0, a1, a2]
  env.B: [b0, b1]
  spec_method: [none, mtp]
  num_speculative_tokens: [2, 3]
  env.C: [c0, c1, c2]
exclude:
  - {env.A: a2, env.B: b1}
  - {env.C: c2, spec_method: none}
include:
  - {spec_method: mtp, serve.--extra: 1}
  - {env.A: a9, env.B: b9}
"""
# Request axes ride on the chosen servers; an exclude rule leaves one server with fewer cells.
REQUESTS = HEAD + """
axes:
  env.A: [x0, x1, x2]
  env.B: [y0, y1, y2]
  env.C: [z0, z1]
  env.D: [w0, w1, w2]
  request.temperature: [0, 1]
  request.top_p: [0.5, 1]
exclude:
  - {env.A: x0, request.temperature: 1}
"""
EIGHT = HEAD + "axes:\n" + "".join(
    f"  env.F{i}: [{', '.join(f'v{j}' for j in range(n))}]\n" for i, n in enumerate((4, 4, 2, 3, 2, 3, 2, 3)))


def matrix_of(tmp_path: Path, text: str) -> Matrix:
    (tmp_path / "s.yaml").write_text(SUITE)
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return load_matrix(path)


def axes_of(cells: tuple[Cell, ...]) -> list[str]:
    return sorted({k for c in cells for k in c.values if not k.startswith("request.")})


def held(cells: tuple[Cell, ...], axes: list[str], t: int) -> set[tuple[tuple[str, str], ...]]:
    """Every t-way combination of server-axis values the cells hold; an axis a cell does not bind
    (collapsed) has the value None there, a combination like any other."""
    out = set()
    for cell in cells:
        value = {a: canonical(cell.values[a]) if a in cell.values else None for a in axes}
        for picked in itertools.combinations(axes, t):
            out.add(tuple((a, str(value[a])) for a in picked))
    return out


def check(matrix: Matrix, design: Design, t: int, exclude: list[dict[str, Any]]) -> None:
    axes = axes_of(matrix.cells)
    # Every allowed combination is covered (and, the chosen being matrix cells, nothing else is).
    assert held(design.cells, axes, t) == held(matrix.cells, axes, t)
    by_id = {c.cell_id: c for c in matrix.cells}
    for cell in design.cells:
        assert by_id.get(cell.cell_id) == cell
        assert not any(all(k in cell.values and canonical(cell.values[k]) == canonical(v) for k, v in rule.items())
                       for rule in exclude), cell.values
    # A chosen server runs every one of its cells: request-only axes are taken in full.
    groups = {g.server_key: g.cells for g in matrix.groups()}
    for group in design.groups:
        assert group.cells == groups[group.server_key]
    assert len({g.server_key for g in design.groups}) == len(design.groups)


@pytest.mark.parametrize("name", ["thor-like", "includes", "requests", "thor.yaml"])
@pytest.mark.parametrize("t", [2, 3, 4])
def test_a_covering_design_covers_every_allowed_combination(name: str, t: int, tmp_path: Path) -> None:
    if name == "thor.yaml":
        matrix = load_matrix(ROOT / "matrices" / "thor.yaml")
    else:
        matrix = matrix_of(tmp_path, {"thor-like": THOR_LIKE, "includes": INCLUDES, "requests": REQUESTS}[name])
    exclude = [dict(r) for r in matrix.raw.get("exclude", [])]
    for seed in (0, 1):
        design = choose(matrix, DesignSpec(kind="covering", strength=t, seed=seed))
        check(matrix, design, t, exclude)
        assert design.strength == t and design.full_groups == len(matrix.groups())
        assert len(design.groups) <= len(matrix.groups())
        if t < 4:  # at 4 a small matrix may need every server
            assert len(design.groups) < len(matrix.groups())


def test_the_matrices_hold_what_the_checks_are_about(tmp_path: Path) -> None:
    """Excluded pairs really are absent, collapsed and include-added axes really occur: the coverage
    test above is about matrices that have them."""
    thor = matrix_of(tmp_path, THOR_LIKE)
    assert not any(c.spec_method == "ngram" and c.env.get("VLLM_USE_V2_MODEL_RUNNER") == "1" for c in thor.cells)
    assert any("num_speculative_tokens" not in c.values for c in thor.cells)
    includes = matrix_of(tmp_path, INCLUDES)
    assert any(c.values.get("serve.--extra") == 1 for c in includes.cells)
    assert any(c.values.get("env.A") == "a9" and "env.C" not in c.values for c in includes.cells)
    requests = matrix_of(tmp_path, REQUESTS)
    assert {len(g.cells) for g in requests.groups()} == {2, 4}


def test_eight_factors_three_way_is_a_small_fraction_of_the_product(tmp_path: Path) -> None:
    """Levels (4,4,2,3,2,3,2,3): 3,456 servers in the product. 3-way coverage takes 60 servers at
    seed 0 (60-68 over seeds 0-2; covertable is quoted at 63-68), 2-way 21."""
    matrix = matrix_of(tmp_path, EIGHT)
    assert len(matrix.groups()) == 3456
    three = choose(matrix, DesignSpec(kind="covering", strength=3, seed=0))
    check(matrix, three, 3, [])
    assert len(three.groups) <= 70
    two = choose(matrix, DesignSpec(kind="covering", strength=2, seed=0))
    check(matrix, two, 2, [])
    assert len(two.groups) <= 24  # 16 is the least possible (4 x 4 levels of the two widest)


def test_a_design_is_reproducible_per_seed(tmp_path: Path) -> None:
    matrix = matrix_of(tmp_path, THOR_LIKE)
    ids = {seed: [c.cell_id for c in choose(matrix, DesignSpec(kind="covering", strength=2, seed=seed)).cells]
           for seed in range(5)}
    again = [c.cell_id for c in choose(matrix_of(tmp_path, THOR_LIKE), DesignSpec(kind="covering", strength=2,
                                                                                  seed=3)).cells]
    assert again == ids[3]
    assert len({tuple(v) for v in ids.values()}) > 1  # the seed does choose


def test_the_full_product_and_a_strength_past_the_axes_run_everything(tmp_path: Path) -> None:
    matrix = matrix_of(tmp_path, REQUESTS)
    full = choose(matrix, DesignSpec(kind="full"))
    assert full.groups == matrix.groups() and full.cells == matrix.cells and full.strength == 4
    for t in (4, 5):
        assert choose(matrix, DesignSpec(kind="covering", strength=t)).groups == matrix.groups()
    assert choose(matrix, DesignSpec(kind="covering", strength=1)).strength == 1


def test_the_design_key_of_a_matrix(tmp_path: Path) -> None:
    assert matrix_of(tmp_path, THOR_LIKE).spec.design_spec == DesignSpec(kind="full")
    assert matrix_of(tmp_path, "design: covering\n" + THOR_LIKE).spec.design_spec == \
        DesignSpec(kind="covering", strength=3)
    assert matrix_of(tmp_path, "design: covering:2\n" + THOR_LIKE).spec.design_spec == \
        DesignSpec(kind="covering", strength=2)
    assert matrix_of(tmp_path, "design: {strength: 4, seed: 9}\n" + THOR_LIKE).spec.design_spec == \
        DesignSpec(kind="covering", strength=4, seed=9)
