"""An agent framework no one here wrote drives a tool loop against `stoke serve`: the OpenAI
Agents SDK (openai-agents) over the chat completions API, on the real default model."""

from __future__ import annotations

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolsToFinalOutputResult,
    function_tool,
    set_tracing_disabled,
)

from tests.e2e.serving import API_KEY, ServerThread

pytestmark = pytest.mark.e2e
ROUNDS = 3


def test_agents_sdk_runs_a_tool_loop(served: ServerThread) -> None:
    set_tracing_disabled(True)  # nothing leaves the machine
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"Sunny and 21 C in {city}."

    def after_tools(context, results) -> ToolsToFinalOutputResult:
        """The agent's own stopping rule: done once three results are in."""
        done = len(asked) >= ROUNDS
        return ToolsToFinalOutputResult(done, results[-1].output if done else None)

    client = openai.AsyncOpenAI(base_url=served.url, api_key=API_KEY, max_retries=0)
    agent = Agent(
        name="traveller",
        instructions="You answer questions about the weather. Use the tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model=served.model, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
        reset_tool_choice=False,
        tool_use_behavior=after_tools,
    )
    result = Runner.run_sync(agent, "What is the weather in Oslo, Rome and Lima?", max_turns=6)
    assert len(asked) == ROUNDS and all(isinstance(city, str) and city for city in asked)
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"] * ROUNDS
    assert len(result.raw_responses) == ROUNDS  # one model call per round trip
    assert result.final_output == f"Sunny and 21 C in {asked[-1]}."
    for response in result.raw_responses[1:]:  # each follow-up reused the KV of the last
        assert response.usage.input_tokens_details.cached_tokens > 0
