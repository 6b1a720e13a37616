"""The reply hook's record without an engine: a request's messages in the store's shape
(system apart, assistant messages with the exact ids replay finds), the text the window
shows for a reply that made calls, and the client's name."""

from __future__ import annotations

from app.server.replay import ReplyStore, calls_key
from app.server.schema import Message
from app.server.served import client_of, served_messages
from app.toolcalls.calls import shown_text
from app.toolcalls.tools import ToolCall

CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')


def test_messages_keep_the_exact_ids_replay_finds() -> None:
    replies = ReplyStore()
    replies.put("<tool_call>x</tool_call>", [7, 8], "fp", content="", calls=_key("", CALL))
    replies.put("It is 18 C.", [9], "other-model")
    resent = ToolCall("id-rewritten", "get_weather", '{ "city":"Paris" }')
    messages = (
        Message("system", "Be brief.\n\n# Tools"),
        Message("user", "Weather?"),
        Message("assistant", "", tool_calls=(resent,)),
        Message("tool", "18 C", tool_call_id="id-rewritten"),
        Message("assistant", "It is 18 C."),  # another model's ids: not this one's
        Message("user", "Tomorrow?"),
    )
    system, history = served_messages(messages, replies, "fp")
    assert system == "Be brief.\n\n# Tools"
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant", "user"]
    assert history[1].tokens == (7, 8) and history[1].tool_calls == (resent,)
    assert history[2].tool_call_id == "id-rewritten"
    assert history[3].tokens is None


def test_a_system_message_inside_the_history_is_not_kept() -> None:
    messages = (Message("user", "Hi"), Message("system", "Now be rude."), Message("user", "Hi"))
    assert served_messages(messages, ReplyStore(), "fp") is None
    system, history = served_messages((Message("user", "Hi"),), ReplyStore(), "fp")
    assert system is None and [m.text for m in history] == ["Hi"]


def test_shown_text_leaves_the_call_syntax_to_the_rows() -> None:
    text = "<think>look it up</think>\n\n<tool_call>{...}</tool_call>"
    assert shown_text(text, "look it up", "", [CALL]) == "<think>look it up</think>\n\n"
    assert shown_text("Done.", "", "Done.", []) == "Done."
    assert shown_text("Let me see\n<tool_call>", "", "Let me see", [CALL]) == "Let me see"


def test_client_names_are_trimmed() -> None:
    assert client_of(None) is None and client_of("   ") is None
    assert client_of(" OpenAI/Python 1.0 ") == "OpenAI/Python 1.0"
    assert len(client_of("x" * 1000)) == 200


def _key(content: str, *calls: ToolCall) -> str:
    return calls_key(content, [c.canonical() for c in calls])
