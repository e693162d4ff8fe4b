"""`python -m vllmsim serve MODEL ...`: the simulator as its own executable."""

from vllmsim.cli import app

app(prog_name="python -m vllmsim")
