"""What the live /trace page of `minivllm serve` may show without --trace-page-show-requests.

Mirrors nothing in vLLM (it has no trace page). The page is for watching the engine: which requests
a step scheduled, how many tokens each, the queues, block ids, the packed batch's shape. It must not
hand one client's request to another visitor, so without the second flag every event is redacted in
the server, before it is stored in the LiveTrace window or sent to any page:

- request text (the prompt as rendered, the output text, a stop string that ended a request) is null;
- token ids (prompt_token_ids, the batch's input_ids, sampled and new tokens, drafts) become lists of
  nulls of the same length, so counts, budgets and block bookkeeping still add up;
- request ids (a client's X-Request-Id is part of them) become aliases, "req-1", "req-2", ... in the
  order the page first saw them, the same alias in every event.

Everything else passes as recorded: numbers, block ids, positions, slot mappings, queue lengths.
"""
from __future__ import annotations

from typing import Any

REQUEST_ID_KEYS = {"request_id", "req_id"}  # a string that is one request id
REQUEST_ID_LIST_KEYS = {"req_ids", "request_ids", "waiting", "running", "finished_req_ids", "preempted_req_ids",
                        "reqs_to_abort"}  # a list of request ids
REQUEST_ID_DICT_KEYS = {"num_scheduled_tokens", "block_tables", "spec_decode", "freed", "num_tokens"}  # keyed by id
TOKEN_DICT_KEYS = {"sampled", "scheduled_spec_decode_tokens"}  # keyed by request id, the values are token ids
TOKEN_KEYS = {"prompt_token_ids", "input_ids", "new_token_ids", "token_ids", "draft_token_ids", "sampled_token_ids"}
TEXT_KEYS = {"prompt", "text", "stop_reason"}  # a client's words (stop_reason: the stop string or token it hit)


def _nulls(value: Any) -> Any:
    """Token ids with their shape kept: a list of n ids -> n nulls; one id -> null."""
    return [_nulls(v) for v in value] if isinstance(value, (list, tuple)) else None


class RequestRedactor:
    """Redacts one event at a time (a copy; the original is not changed), with aliases stable across events."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}

    def alias(self, request_id: Any) -> Any:
        if not isinstance(request_id, str):
            return request_id
        if request_id not in self.aliases:
            self.aliases[request_id] = f"req-{len(self.aliases) + 1}"
        return self.aliases[request_id]

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        return self._walk(event, None)

    def _walk(self, value: Any, key: str | None) -> Any:
        if key in TEXT_KEYS:
            return None
        if key in TOKEN_KEYS:
            return _nulls(value)
        if key in REQUEST_ID_KEYS:
            return self.alias(value)
        if key in REQUEST_ID_LIST_KEYS and isinstance(value, list):
            return [self.alias(r) for r in value]
        if key in TOKEN_DICT_KEYS and isinstance(value, dict):
            return {self.alias(r): _nulls(v) for r, v in value.items()}
        if key in REQUEST_ID_DICT_KEYS and isinstance(value, dict):
            return {self.alias(r): self._walk(v, None) for r, v in value.items()}
        if isinstance(value, dict):
            return {k: self._walk(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, None) for v in value]
        if isinstance(value, str) and value in self.aliases:  # a request id under a key not listed above
            return self.aliases[value]
        return value
