"""MCP servers and their tools: the Model Context Protocol client room.

May import: paths, stored and units only (ground), and the official `mcp` SDK (with the anyio
and httpx2 it runs on). It knows nothing of engines, Qt, the session or the server: it keeps
the list of servers, connects to them, calls their tools and shapes what they answer; whoever
runs a tool loop decides when to call and asks the person first.

config.py is Stoke's `mcp.json` (the shape Claude Desktop, LM Studio and Cursor use, plus
Stoke's own per-server fields), read back with its problems in words and edited in place;
other_apps.py finds those apps' files and brings their servers in. client.py is one live
connection (stdio or Streamable HTTP) and its state; stderr.py keeps a stdio server's last
words; words.py says what went wrong; pool.py holds one connection per server, started when
first needed and stopped on close. results.py makes a tool's answer fit a chat (non-text parts
described, long text cut for the model with a note). trust.py remembers what the person
approved: a tool always allowed, a server trusted.
"""
