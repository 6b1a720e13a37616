"""The desktop window: Qt widgets only. Talks to the engine through ChatSession (asyncio,
run on Qt's loop by qasync) and to storage through the conversation store's API. The
window's parts (menus, model_picker, draft_files, overflow) are handed the window, typed by a
Protocol of what each uses, so none imports main_window.

May import: server (Settings > API Server), tool_loop and mcp (tools in the chat, Settings >
Tools: chat_tools.py), toolcalls, session, launch, remote_config, settings, models, hardware,
engine, conversations, paths, resources. Nothing imports it but
`app.__main__` and `stoke bench ui`.
"""
