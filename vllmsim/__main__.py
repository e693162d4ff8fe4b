"""`python -m vllmsim serve MODEL ...`: the simulator as its own executable."""

import sys

if sys.argv[1:2] == ["serve"]:
    # A server start, the simulator's hot path: straight to its flags (what `serve` under the Typer
    # app does too, handing every argument after `serve` on unparsed), without importing the app.
    from vllmsim.serve import serve_main

    sys.exit(serve_main(sys.argv[2:]))

from vllmsim.cli import app

app(prog_name="python -m vllmsim")
