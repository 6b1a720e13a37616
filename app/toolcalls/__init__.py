"""The tool-call mechanism, one for the API server and the chat session alike: function tools
and calls (tools.py), how a model is told about tools (prompt.py), each model family's call
syntax (syntax.py; dsml.py: DeepSeek's DSML; json_prefix.py: how much of a call's JSON can be
shown as it streams), a reply's reasoning apart from its content (reasoning.py), the calls a
finished reply makes (calls.py), and the grammar that forces a call or a JSON answer
(grammar.py). What it refuses is a ToolError in words naming the field; each user words it
for its own audience (the server as its 400).

May import: engine (chat templates, the grammar library's check). Never the server, the
session or the UI: the server and the session both import this room.
"""
