#!/usr/bin/env python3
"""The official OpenAI Python SDK (pinned in requirements.txt beside this file) against LMSP on a
real model, SmolLM2 135M Instruct: tool loops, structured outputs, `stop` and log probabilities,
as an application writes them.

tests/sdk_real_models.rs runs it twice: against `lmsp serve --engine llama` (the model in
process) and against `lmsp serve --engine openai` in front of llama.cpp's own server (the pinned
xllamacpp, tests/llamacpp/serve.py, with the tool-call chat template
tests/llamacpp/smollm2-tools.jinja). Every request is small, and greedy (`temperature=0`)
except where a check is about sampling.

Environment:
  LMSP_BASE_URL  the service's base URL with /v1, e.g. http://127.0.0.1:8717/v1
  LMSP_TOKEN     an application's client token (responses:write, responses:read, models:read)
  LMSP_MODEL     the model id SmolLM2 is registered under
  LMSP_ENGINE    `llama` or `openai`: what the service runs (what differs is said where it does)

Exits 0 when every check passed, non-zero otherwise.

Run: target/openai-sdk-venv/bin/python tests/sdk/test_real_models.py [-v]
(the venv comes from scripts/openai-sdk-deps).
"""

import json
import os
import sys
import unittest
from typing import Literal

import openai
import pydantic
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
)


def required_env(name):
    value = os.environ.get(name)
    if not value:
        sys.exit(f"{name} is not set: tests/sdk_real_models.rs sets it (see this file's doc)")
    return value


BASE_URL = required_env("LMSP_BASE_URL")
TOKEN = required_env("LMSP_TOKEN")
MODEL = required_env("LMSP_MODEL")
ENGINE = required_env("LMSP_ENGINE")
if ENGINE not in ("llama", "openai"):
    sys.exit(f"LMSP_ENGINE is `llama` or `openai`, not {ENGINE!r}")

# A whole run on SmolLM2 takes seconds; this bounds a request that hangs.
DEADLINE = 120.0


class GetWeather(pydantic.BaseModel):
    """The forecast of a city: the tool's parameters, every value bounded so that a call always
    closes within its token budget."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(min_length=1, max_length=30)
    days: int = pydantic.Field(ge=1, le=7)


class Person(pydantic.BaseModel):
    """A structured output's schema, bounded like GetWeather."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(min_length=1, max_length=24)
    age: int = pydantic.Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]


PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 30},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
DESCRIPTION = "The weather forecast of a city."
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": DESCRIPTION,
                    "parameters": PARAMETERS, "strict": True}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION,
                                                "parameters": PARAMETERS, "strict": True}}]

# One earlier exchange, a call and its answer, before the question: llama.cpp's server does not
# force a call under `tool_choice` (it lets the model write text before `<tool_call>`, see
# docs/engines.md), so through it the model must choose to call, which SmolLM2 does after an
# example. The llama engine forces the call either way; the same conversation goes to both.
EXAMPLE_ARGUMENTS = json.dumps({"city": "London", "days": 1})
EXAMPLE_RESULT = json.dumps({"forecast": "rain", "celsius": 12})
EXAMPLE_ANSWER = "It will rain in London tomorrow, at 12 degrees."
QUESTION = "What will the weather be in Paris this week?"
RESULT = json.dumps({"forecast": "sunny", "celsius": 21})

RESPONSES_CONVERSATION = [
    {"role": "user", "content": "What is the weather in London tomorrow?"},
    {"type": "function_call", "call_id": "call_example", "name": "get_weather",
     "arguments": EXAMPLE_ARGUMENTS},
    {"type": "function_call_output", "call_id": "call_example", "output": EXAMPLE_RESULT},
    {"role": "assistant", "content": EXAMPLE_ANSWER},
    {"role": "user", "content": QUESTION},
]
CHAT_CONVERSATION = [
    {"role": "user", "content": "What is the weather in London tomorrow?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_example", "type": "function",
         "function": {"name": "get_weather", "arguments": EXAMPLE_ARGUMENTS}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": EXAMPLE_RESULT},
    {"role": "assistant", "content": EXAMPLE_ANSWER},
    {"role": "user", "content": QUESTION},
]

PROMPT = "Write one sentence about the sea."


def validated(cls, obj):
    """Validates what the SDK built (it constructs without validating) against its type."""
    return cls.model_validate(obj.to_dict())


class RealModel(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.client = OpenAI(base_url=BASE_URL, api_key=TOKEN, timeout=DEADLINE, max_retries=0)

    def assert_weather_call(self, name, arguments):
        """A call of get_weather whose arguments validate against its parameters."""
        self.assertEqual(name, "get_weather")
        GetWeather.model_validate_json(arguments)

    def test_01_tool_loop_responses(self):
        """Responses: tool_choice "required" gives one function_call whose arguments validate;
        its function_call_output sent back (tool_choice "none") gets a text answer; the same
        two turns streamed show the call's argument events and the answer's text deltas."""
        first = self.client.responses.create(
            model=MODEL, input=RESPONSES_CONVERSATION, tools=RESPONSES_TOOLS,
            tool_choice="required", max_output_tokens=40, temperature=0)
        validated(Response, first)
        calls = [item for item in first.output if item.type == "function_call"]
        self.assertEqual(len(calls), 1, first.output)
        call = calls[0]
        self.assertIsInstance(call, ResponseFunctionToolCall)
        self.assertTrue(call.call_id.startswith("call_"), call.call_id)
        self.assert_weather_call(call.name, call.arguments)
        answer = {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}
        final = self.client.responses.create(
            model=MODEL, input=[*RESPONSES_CONVERSATION, *first.output, answer],
            tools=RESPONSES_TOOLS, tool_choice="none", max_output_tokens=24, temperature=0)
        validated(Response, final)
        self.assertEqual([item.type for item in final.output], ["message"], final.output)
        self.assertTrue(final.output_text.strip(), final.output)

        deltas = []
        done = None
        with self.client.responses.stream(
            model=MODEL, input=RESPONSES_CONVERSATION, tools=RESPONSES_TOOLS,
            tool_choice="required", max_output_tokens=40, temperature=0,
        ) as stream:
            for event in stream:
                if event.type == "response.function_call_arguments.delta":
                    self.assertIsInstance(event, ResponseFunctionCallArgumentsDeltaEvent)
                    deltas.append(event.delta)
                if event.type == "response.function_call_arguments.done":
                    self.assertIsInstance(event, ResponseFunctionCallArgumentsDoneEvent)
                    done = event.arguments
            streamed = stream.get_final_response()
        streamed_calls = [item for item in streamed.output if item.type == "function_call"]
        self.assertEqual(len(streamed_calls), 1, streamed.output)
        self.assert_weather_call(streamed_calls[0].name, streamed_calls[0].arguments)
        self.assertEqual("".join(deltas), streamed_calls[0].arguments)
        self.assertEqual(done, streamed_calls[0].arguments)

        answer = {**answer, "call_id": streamed_calls[0].call_id}
        text = []
        with self.client.responses.stream(
            model=MODEL, input=[*RESPONSES_CONVERSATION, *streamed.output, answer],
            tools=RESPONSES_TOOLS, tool_choice="none", max_output_tokens=24, temperature=0,
        ) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    text.append(event.delta)
            streamed_final = stream.get_final_response()
        self.assertTrue("".join(text).strip(), streamed_final.output)
        self.assertEqual("".join(text), streamed_final.output_text)

    def test_02_tool_loop_chat(self):
        """Chat: tool_choice "required" gives one tool call (finish_reason tool_calls) whose
        arguments validate; the assistant message and a tool message sent back (tool_choice
        "none") get text; the same streamed: the chunks' argument pieces make the call, and the
        answer's content pieces its text."""
        first = self.client.chat.completions.create(
            model=MODEL, messages=CHAT_CONVERSATION, tools=CHAT_TOOLS, tool_choice="required",
            max_completion_tokens=40, temperature=0)
        validated(ChatCompletion, first)
        choice = first.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls", choice)
        self.assertEqual(len(choice.message.tool_calls), 1, choice.message)
        call = choice.message.tool_calls[0]
        self.assertEqual(call.type, "function")
        self.assert_weather_call(call.function.name, call.function.arguments)
        tool_message = {"role": "tool", "tool_call_id": call.id, "content": RESULT}
        final = self.client.chat.completions.create(
            model=MODEL, messages=[*CHAT_CONVERSATION, choice.message, tool_message],
            tools=CHAT_TOOLS, tool_choice="none", max_completion_tokens=24, temperature=0)
        validated(ChatCompletion, final)
        self.assertIn(final.choices[0].finish_reason, ("stop", "length"))
        self.assertFalse(final.choices[0].message.tool_calls)
        self.assertTrue(final.choices[0].message.content.strip(), final.choices[0])

        chunks = list(self.client.chat.completions.create(
            model=MODEL, messages=CHAT_CONVERSATION, tools=CHAT_TOOLS, tool_choice="required",
            max_completion_tokens=40, temperature=0, stream=True))
        for chunk in chunks:
            validated(ChatCompletionChunk, chunk)
        pieces = [c.choices[0].delta.tool_calls[0] for c in chunks
                  if c.choices and c.choices[0].delta.tool_calls]
        self.assertTrue(pieces, chunks)
        self.assertTrue(pieces[0].id, pieces[0])
        self.assertEqual({p.index for p in pieces}, {0}, pieces)
        arguments = "".join(p.function.arguments or "" for p in pieces)
        self.assert_weather_call(pieces[0].function.name, arguments)
        reasons = [c.choices[0].finish_reason for c in chunks
                   if c.choices and c.choices[0].finish_reason]
        self.assertEqual(reasons, ["tool_calls"], chunks)

        streamed_message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": pieces[0].id, "type": "function",
             "function": {"name": pieces[0].function.name, "arguments": arguments}}]}
        tool_message = {**tool_message, "tool_call_id": pieces[0].id}
        text = "".join(
            c.choices[0].delta.content or ""
            for c in self.client.chat.completions.create(
                model=MODEL, messages=[*CHAT_CONVERSATION, streamed_message, tool_message],
                tools=CHAT_TOOLS, tool_choice="none", max_completion_tokens=24,
                temperature=0, stream=True)
            if c.choices)
        self.assertTrue(text.strip())

    def test_03_pydantic_tool_parsed(self):
        """chat.completions.parse with openai.pydantic_function_tool: the call's
        parsed_arguments is a GetWeather (validated by pydantic, its bounds included)."""
        tool = openai.pydantic_function_tool(GetWeather, name="get_weather",
                                             description=DESCRIPTION)
        completion = self.client.chat.completions.parse(
            model=MODEL, messages=CHAT_CONVERSATION, tools=[tool], tool_choice="required",
            max_completion_tokens=40, temperature=0)
        calls = completion.choices[0].message.tool_calls
        self.assertEqual(len(calls), 1, completion.choices[0])
        self.assertIsInstance(calls[0].function.parsed_arguments, GetWeather)

    def test_04_structured_outputs_parse(self):
        """responses.parse(text_format=Person) and chat.completions.parse(response_format=Person)
        give a Person, greedy and sampled (temperature 1): the grammar of the schema keeps every
        run valid."""
        for seed in (None, 7):
            sampling = ({"temperature": 0} if seed is None
                        else {"temperature": 1.0, "extra_body": {"seed": seed}})
            parsed = self.client.responses.parse(
                model=MODEL, input="Describe a person as JSON.", text_format=Person,
                max_output_tokens=60, **sampling)
            self.assertEqual(parsed.status, "completed", parsed)
            self.assertIsInstance(parsed.output_parsed, Person, parsed)
            chat_sampling = ({"temperature": 0} if seed is None
                             else {"temperature": 1.0, "seed": seed})
            completion = self.client.chat.completions.parse(
                model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
                response_format=Person, max_completion_tokens=60, **chat_sampling)
            self.assertEqual(completion.choices[0].finish_reason, "stop", completion)
            self.assertIsInstance(completion.choices[0].message.parsed, Person, completion)

    def test_05_stop(self):
        """chat.completions.create(stop=[s]): the greedy text ends just before the first s,
        which is not returned, and finish_reason is stop."""
        messages = [{"role": "user", "content": PROMPT}]
        full = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
        text = full.choices[0].message.content
        words = text.split()
        self.assertGreater(len(words), 3, text)
        stop = f" {words[2]}"
        stopped = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=16, temperature=0,
            stop=[stop])
        self.assertEqual(stopped.choices[0].message.content, text[: text.index(stop)])
        self.assertEqual(stopped.choices[0].finish_reason, "stop")

    def test_06_logprobs(self):
        """Chat logprobs + top_logprobs, whole and streamed, and Responses
        include=["message.output_text.logprobs"]: one entry per generated token, whose texts
        make the content; greedy, each token is the likeliest of its top_logprobs."""
        messages = [{"role": "user", "content": PROMPT}]
        completion = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=6, temperature=0,
            logprobs=True, top_logprobs=2)
        validated(ChatCompletion, completion)
        content = completion.choices[0].logprobs.content
        self.assertEqual(len(content), completion.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in content), completion.choices[0].message.content)
        for token in content:
            self.assertLessEqual(token.logprob, 0.0)
            self.assertEqual(len(token.top_logprobs), 2, token)
            self.assertEqual(token.top_logprobs[0].token, token.token, token)
            self.assertAlmostEqual(token.top_logprobs[0].logprob, token.logprob, places=4)
            self.assertGreaterEqual(token.top_logprobs[0].logprob, token.top_logprobs[1].logprob)
        streamed = [
            token
            for chunk in self.client.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=6, temperature=0,
                logprobs=True, top_logprobs=2, stream=True)
            if chunk.choices and chunk.choices[0].logprobs
            for token in chunk.choices[0].logprobs.content
        ]
        self.assertEqual([t.token for t in streamed], [t.token for t in content])
        response = self.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=6, temperature=0,
            include=["message.output_text.logprobs"], top_logprobs=2)
        validated(Response, response)
        logprobs = response.output[0].content[0].logprobs
        self.assertEqual(len(logprobs), response.usage.output_tokens)
        self.assertEqual("".join(t.token for t in logprobs), response.output_text)


if __name__ == "__main__":
    print(f"openai {openai.__version__} against {BASE_URL} ({ENGINE} engine, model {MODEL})",
          flush=True)
    unittest.main(verbosity=2)
