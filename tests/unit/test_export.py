"""Export to JSON and Markdown, and import back, against a real store."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.conversations import ConversationStore, StoreError
from app.conversations.export import (
    ImportFormatError,
    export_json,
    export_markdown,
    import_json,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    with ConversationStore.open(tmp_path / "conversations.db") as opened:
        yield opened


@pytest.fixture
def branched(store: ConversationStore) -> str:
    """Two user turns, the first reply regenerated once, the second user turn edited once;
    the current branch goes through the regenerated reply and the edit."""
    conversation = store.create_conversation(
        "Rust lifetimes", "Answer briefly.", {"temperature": 0.3, "seed": 7, "custom": [1, 2]}
    )
    cid = conversation.id
    question = store.add_message(cid, None, "user", "What is a lifetime?")
    store.add_message(
        cid,
        question.id,
        "assistant",
        "First try.",
        token_ids=[1, 2, 3],
        tokens_fingerprint="fp",
        finish_reason="stop",
        stats={"tokens_per_s": 42.0},
    )
    reply = store.add_message(
        cid,
        question.id,
        "assistant",
        "<think>\nThe user wants a definition.\n</think>\n\nA scope a **borrow** is valid for.",
        token_ids=[4, 5, 2**32 - 1],
        tokens_fingerprint="fp",
        finish_reason="stop",
    )
    store.add_message(cid, reply.id, "user", "Show an example")
    edited = store.add_message(cid, reply.id, "user", "Show an example with structs")
    store.add_message(
        cid, edited.id, "assistant", "struct Foo<'a> { x: &'a str }", status="interrupted"
    )
    return cid


def _shape(store: ConversationStore, conversation_id: str) -> list[tuple]:
    """The tree without ids: each message with the path of contents leading to it."""
    exported = export_json(store, conversation_id)
    by_id = {m["id"]: m for m in exported["messages"]}

    def lineage(message: dict[str, Any]) -> tuple[str, ...]:
        parent = message["parent_id"]
        return (*lineage(by_id[parent]), message["content"]) if parent else (message["content"],)

    return [
        (
            lineage(m),
            m["role"],
            m["status"],
            m["finish_reason"],
            m["stats"],
            m["token_ids"],
            m["tokens_fingerprint"],
        )
        for m in exported["messages"]
    ]


def test_round_trip_keeps_tree_tokens_and_branch(store: ConversationStore, branched: str) -> None:
    exported = json.loads(json.dumps(export_json(store, branched)))  # through a real file format
    assert exported["format"] == "stoke.conversation"
    assert exported["version"] == 1
    assert len(exported["messages"]) == 6

    imported = import_json(store, exported)

    original = store.get_conversation(branched)
    assert imported.id != original.id
    assert imported.title == "Rust lifetimes"
    assert imported.system_prompt == "Answer briefly."
    assert imported.sampling == {"temperature": 0.3, "seed": 7, "custom": [1, 2]}
    assert _shape(store, imported.id) == _shape(store, branched)
    new_ids = {m["id"] for m in export_json(store, imported.id)["messages"]}
    assert not new_ids & {m["id"] for m in exported["messages"]}
    assert [m.content for m in store.current_path(imported.id)] == [
        m.content for m in store.current_path(branched)
    ]
    assert store.current_path(imported.id)[1].token_ids == [4, 5, 2**32 - 1]
    reply = store.current_path(imported.id)[1]
    alternatives, index = store.siblings(reply.id)
    assert ([m.content for m in alternatives], index) == (["First try.", reply.content], 1)


def test_import_maps_a_current_leaf_off_the_newest_branch(
    store: ConversationStore, branched: str
) -> None:
    first_reply = store.children(store.current_path(branched)[0].id, branched)[0]
    store.set_current_leaf(branched, first_reply.id)

    imported = import_json(store, export_json(store, branched))

    assert [m.content for m in store.current_path(imported.id)] == [
        "What is a lifetime?",
        "First try.",
    ]


def test_import_of_a_reply_cut_off_mid_stream_marks_it_interrupted(
    store: ConversationStore,
) -> None:
    cid = store.create_conversation().id
    question = store.add_message(cid, None, "user", "Hi")
    store.add_message(cid, question.id, "assistant", "Hel", status="streaming")

    imported = import_json(store, export_json(store, cid))

    assert store.current_path(imported.id)[-1].status == "interrupted"


def test_import_of_an_empty_conversation(store: ConversationStore) -> None:
    cid = store.create_conversation().id

    imported = import_json(store, export_json(store, cid))

    assert imported.title is None
    assert imported.current_leaf_id is None
    assert store.current_path(imported.id) == []


def test_markdown_shows_the_current_branch(store: ConversationStore, branched: str) -> None:
    text = export_markdown(store, branched)

    assert text.startswith("# Rust lifetimes\n")
    assert "## System prompt\n\nAnswer briefly." in text
    assert "**You**\n\nWhat is a lifetime?" in text
    assert (
        "**Assistant**\n\n<details>\n<summary>Reasoning</summary>\n\n"
        "The user wants a definition.\n\n</details>\n\nA scope a **borrow** is valid for."
    ) in text
    assert "**You**\n\nShow an example with structs" in text
    assert "**Assistant** *(interrupted)*\n\nstruct Foo" in text
    assert "First try." not in text  # another branch
    assert "Show an example\n" not in text
    assert "<think>" not in text


def test_markdown_of_untitled_conversation_and_reasoning_without_opening_tag(
    store: ConversationStore,
) -> None:
    cid = store.create_conversation().id
    store.add_message(cid, None, "assistant", "weighing it up</think>Yes.")

    text = export_markdown(store, cid)

    assert text.startswith("# New conversation\n")
    assert "weighing it up\n\n</details>\n\nYes." in text


def _valid(store: ConversationStore, conversation_id: str) -> dict[str, Any]:
    return copy.deepcopy(export_json(store, conversation_id))


def _break(data: dict[str, Any], how: str) -> None:
    messages = data["messages"]
    if how == "format":
        data["format"] = "chatgpt.export"
    elif how == "newer":
        data["version"] = 4
    elif how == "no version":
        del data["version"]
    elif how == "no conversation":
        del data["conversation"]
    elif how == "no messages":
        data["messages"] = {"not": "a list"}
    elif how == "missing content":
        del messages[1]["content"]
    elif how == "role":
        messages[0]["role"] = "system"
    elif how == "status":
        messages[0]["status"] = "done"
    elif how == "token ids":
        messages[1]["token_ids"] = [1, "two"]
    elif how == "duplicate":
        messages[2]["id"] = messages[1]["id"]
    elif how == "dangling":
        messages[1]["parent_id"] = "nowhere"
    elif how == "cycle":
        messages[0]["parent_id"] = messages[1]["id"]
    elif how == "leaf":
        data["current_leaf_id"] = "nowhere"
    elif how == "sampling":
        data["conversation"]["sampling"] = [0.7]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("format", "This file is neither a Stoke conversation export nor a list of chat"),
        ("newer", "exported by a newer Stoke (format version 4; this Stoke reads up to 3)"),
        ("no version", "no valid format version"),
        ("no conversation", "no conversation section"),
        ("no messages", "no list of messages"),
        ("missing content", "Message 2 is missing content."),
        ("role", "Message 1 has the role 'system'; expected one of user, assistant, tool."),
        ("status", "Message 1 has an unknown status 'done'."),
        ("token ids", "Message 2's token_ids must be a list of token ids."),
        ("duplicate", "Message 3 repeats the id"),
        ("dangling", "replies to 'nowhere', which is not in the file."),
        ("cycle", "is part of a loop of replies"),
        ("leaf", "The current message 'nowhere' is not among the conversation's messages."),
        ("sampling", "sampling settings must be an object"),
    ],
)
def test_bad_input_is_rejected_and_writes_nothing(
    store: ConversationStore, branched: str, how: str, message: str
) -> None:
    data = _valid(store, branched)
    _break(data, how)
    before = store.list_conversations(include_deleted=True)

    with pytest.raises(ImportFormatError, match=re.escape(message)):
        import_json(store, data)

    assert store.list_conversations(include_deleted=True) == before


@pytest.mark.parametrize("data", [None, [], "stoke.conversation", {"version": 1}])
def test_not_an_export_at_all(store: ConversationStore, data: Any) -> None:
    with pytest.raises(ImportFormatError, match=r"(not|neither) a Stoke conversation export"):
        import_json(store, data)


def test_import_error_is_a_store_error() -> None:
    assert issubclass(ImportFormatError, StoreError)
