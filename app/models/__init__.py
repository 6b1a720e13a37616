"""The models a user has and can get: the library, downloads from the Hub, the catalog and
its fit verdicts, per-model load settings, the hub token (keychain), the bundled default.

May import: hardware (the planner judges catalog entries), engine (GGUF reading, the
fingerprint), paths, stored (its files' schemas), resources. Never settings, session, server
or the UI.
"""
