"""The local OpenAI-compatible API server over the app's engine host (see app.py): OpenAI
chat/completions/responses, Anthropic messages, exact replies, the API key. Every API runs on
one request core (requests.py); app.py imports the dialects, which are handed the core. Tool
calls (definitions, each family's syntax, parsing, the forcing grammar) are the tool-call
room's, which the chat session uses too; what it refuses is answered here as a 400.

It answers with the models of an engine pool (app/pool): `stoke serve`'s holds the library,
each model loaded on demand; the window's holds its own engine alone.

May import: launch, session, pool, toolcalls, settings, models (the key in the keychain),
engine, paths.
Never the CLI or the UI (`app.cli.serve` and Settings > API Server drive it).
"""
