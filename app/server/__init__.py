"""The local OpenAI-compatible API server over the app's engine host (see app.py): OpenAI
chat/completions/responses, Anthropic messages, exact replies, the API key.

May import: launch, session, settings, models (the key in the keychain), engine, paths.
Never the CLI or the UI (`app.cli.serve` and Settings > API Server drive it).
"""
