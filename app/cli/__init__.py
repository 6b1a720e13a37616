"""The terminal: one module per subcommand (chat, models, serve, doctor, bench, plan, dev),
each adding its argparse parser and printing what the rooms below compute.

May import: session, launch, server, doctor, models, hardware, engine, conversations,
settings, paths, bench. Not the window (only `app.__main__` starts it).
"""
