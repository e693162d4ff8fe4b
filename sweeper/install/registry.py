"""The install-kind registry: the ways of getting vLLM (or the simulator) at a commit, one class each
(`sim`, `preinstalled`, `wheels`, `source`, `pip`), chosen by name from this one table.

A new kind is one `InstallKind` subclass and one `register(...)`: the matrix loader accepts its name
(`sweeper.install.matrix_loader`), the planner, the executors and the environment cache ask it their
questions (`sweeper.install.kind`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper.install.kind import InstallKind
from sweeper.install.pip import Pip
from sweeper.install.preinstalled import Preinstalled
from sweeper.install.sim import Sim
from sweeper.install.source import Source
from sweeper.install.wheels import Wheels
from sweeper.plan import cost

if TYPE_CHECKING:
    from sweeper.spec.matrix import MatrixFile

__all__ = ["kind_of", "names", "register", "stated_profile", "unregister"]

_KINDS: dict[str, InstallKind] = {}


def register(kind: InstallKind) -> InstallKind:
    """Make `kind` the one of its name (a matrix's `install.kind`); refused when the name is taken."""
    if kind.name in _KINDS:
        raise ValueError(f"install kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget the kind of this name (a kind registered for a while, such as a test's toy kind)."""
    del _KINDS[name]


def names() -> tuple[str, ...]:
    """The registered kinds' names, in the order they were registered."""
    return tuple(_KINDS)


def kind_of(name: str) -> InstallKind:
    """The kind of this name. A matrix's kind was checked when it was parsed: a KeyError here is a bug."""
    return _KINDS[name]


def stated_profile(spec: MatrixFile) -> cost.Profile:
    """The cost its install kind states for a matrix (before the matrix's own `cost:` key)."""
    kind = kind_of(spec.install.kind)
    return cost.stated(kind.name, kind.cost_s)


for _builtin in (Sim(), Preinstalled(), Wheels(), Source(), Pip()):
    register(_builtin)
