"""The desktop window: Qt widgets only. Talks to the engine through ChatSession (asyncio,
run on Qt's loop by qasync) and to storage through the conversation store's API."""
