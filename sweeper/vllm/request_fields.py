"""The fields of a chat-completions request that vLLM reads: OpenAI's ChatCompletion request and
vLLM's own extensions (`ChatCompletionRequest` in vllm/entrypoints/openai/protocol.py), pinned here.

vLLM accepts any other field and ignores it ("The following fields were present in the request but
ignored: {...}", at WARNING in older releases, at DEBUG in recent ones, so usually unseen): a typo in
`request.temprature` runs the default temperature. A matrix's request fields are checked against this
list before anything starts (`sweeper.drivers.preflight`). New vLLM releases add fields; a field missing
here is warned about, not refused, unless it is one edit away from a listed one.
"""

from __future__ import annotations

CHAT_FIELDS: frozenset[str] = frozenset({
    "messages", "model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
    "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
    "stream_options", "temperature", "top_p", "tools", "tool_choice", "reasoning_effort", "include_reasoning",
    "parallel_tool_calls", "user", "function_call", "functions", "metadata", "store", "modalities", "audio",
    "prediction", "service_tier", "web_search_options", "verbosity", "safety_identifier", "prompt_cache_key",
    "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
    "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
    "bad_words", "echo", "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
    "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "guided_decoding_backend",
    "guided_whitespace_pattern", "priority", "request_id", "logits_processors", "return_tokens_as_token_ids",
    "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs", "thinking_token_budget",
})
