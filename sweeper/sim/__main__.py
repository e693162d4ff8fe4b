"""`python -m sweeper.sim serve MODEL ...`: the simulator as its own executable."""

from sweeper.sim.cli import app

app(prog_name="python -m sweeper.sim")
