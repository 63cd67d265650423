"""A generated tool call whose arguments are not a JSON object: vLLM's own Messages endpoint
answers 400 (its ``AnthropicContentBlock`` refuses a non-object ``input``; a pydantic
``ValidationError`` is a ``ValueError``, which its error handler answers 400), so the gateway's
mapping refuses it with a 400 naming the block instead of handing the SDK an ``input`` of another
type. Pure mapping: a dummy-weights model cannot be made to generate such a call on demand."""

from __future__ import annotations

from typing import Any

import pytest

from mmgate.anthropic_chat.reply import message_from_chat
from mmgate.api.anthropic.reply import error_body
from mmgate.errors import InvalidRequestError


def chat_reply(arguments: str) -> dict[str, Any]:
    call = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": "ok", "tool_calls": [call]}}]}


@pytest.mark.parametrize("arguments", ["true", "[1, 2]", "\"text\"", "3", "{not json"])
def test_tool_input_that_is_not_an_object_is_a_400_naming_the_block(arguments: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        message_from_chat(chat_reply(arguments))
    assert info.value.status == 400 and info.value.param == "content[1].input"
    assert error_body(info.value)["error"]["type"] == "invalid_request_error"


def test_an_object_input_is_mapped() -> None:
    message = message_from_chat(chat_reply('{"q": 1}'))
    assert message["content"][1] == {"type": "tool_use", "id": "call-1", "name": "f", "input": {"q": 1}}
    assert message["stop_reason"] == "tool_use"
