"""The local OpenAI-compatible API server over the app's engine host (see app.py)."""
