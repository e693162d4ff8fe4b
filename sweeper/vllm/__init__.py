"""Real vLLM, as the sweeper needs it: serve flags per version, and what the server log says it ran.

Pure, so that readers may import it: asking an environment for its flags is `sweeper.install.supported`.
"""

from sweeper.vllm.flags import FlagSet, Launch, parse_help, serve_command
from sweeper.vllm.logs import (
    EffectiveConfig,
    diff,
    effective_config,
    error_lines,
    failure_reason,
    is_error_line,
    non_default_args,
    request_log_lines,
    requested_config,
)

__all__ = [
    "EffectiveConfig", "FlagSet", "Launch", "diff", "effective_config", "error_lines", "failure_reason", "is_error_line",
    "non_default_args", "parse_help", "request_log_lines", "requested_config", "serve_command",
]
