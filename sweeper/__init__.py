"""sweep: which vLLM serving configurations break, and which vLLM commit broke them."""

__version__ = "0.1.0"
