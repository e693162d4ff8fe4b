"""The fields of a chat-completions request that vLLM reads: OpenAI's ChatCompletion request and
vLLM's own extensions (`ChatCompletionRequest` in vLLM's entrypoints), pinned here and refreshed by
`scripts/refresh_vllm_lists.py` from a release's wheel.

vLLM accepts any other field and ignores it ("The following fields were present in the request but
ignored: {...}", at WARNING in older releases, at DEBUG in recent ones, so usually unseen): a typo in
`request.temprature` runs the default temperature. A matrix's request fields are checked against this
list before anything starts (`sweeper.drivers.preflight`). New vLLM releases add fields; a field missing
here is warned about, not refused, unless it is one edit away from a listed one.
"""

from __future__ import annotations

# The release the list was last refreshed from (it keeps what earlier releases read).
SOURCE = "vllm 0.34.0"

CHAT_FIELDS: frozenset[str] = frozenset({
    "add_generation_prompt", "add_special_tokens", "allowed_token_ids", "audio", "bad_words", "best_of",
    "cache_salt", "chat_template", "chat_template_kwargs", "continue_final_message", "documents",
    "ec_transfer_params", "echo", "frequency_penalty", "function_call", "functions", "guided_choice",
    "guided_decoding_backend", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern",
    "ignore_eos", "include_reasoning", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
    "logit_bias", "logits_processors", "logprob_token_ids", "logprobs", "max_completion_tokens", "max_tokens",
    "media_io_kwargs", "messages", "metadata", "min_p", "min_tokens", "mm_payload", "mm_processor_kwargs",
    "modalities", "model", "n", "parallel_tool_calls", "prediction", "presence_penalty", "priority",
    "prompt_cache_key", "prompt_logprobs", "reasoning_effort", "repetition_detection", "repetition_penalty",
    "request_id", "response_format", "return_mm_kwargs", "return_prompt_text", "return_token_ids",
    "return_token_offsets", "return_tokens_as_token_ids", "return_weight_versions",
    "routed_experts_prompt_start", "safety_identifier", "seed", "service_tier", "session_id",
    "skip_special_tokens", "spaces_between_special_tokens", "stop", "stop_token_ids", "store", "stream",
    "stream_interval", "stream_options", "structural_tag", "structured_outputs", "temperature",
    "thinking_token_budget", "tool_choice", "tools", "top_k", "top_logprobs", "top_p",
    "truncate_prompt_tokens", "truncation_side", "use_beam_search", "user", "verbosity", "vllm_xargs",
    "watermarking", "web_search_options",
})
