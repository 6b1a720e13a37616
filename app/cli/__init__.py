"""The terminal: one module per subcommand (chat, models, serve, doctor, bench, plan, dev),
each adding its argparse parser and printing what the rooms below compute; chat_tools.py is
chat's side of MCP tools (the servers it uses, each call asked about on the terminal).

May import: session, launch, server, tool_loop, mcp, doctor, models, hardware, engine,
conversations, settings, paths, bench. Not the window (only `app.__main__` starts it).
"""
