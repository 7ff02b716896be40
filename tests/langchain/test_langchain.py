#!/usr/bin/env python3
"""LangChain's OpenAI integration (`langchain-openai`, pinned with every dependency in
requirements.txt beside this file) against LMSP on a real model, SmolLM2 135M Instruct run in
process (`--engine llama`): `ChatOpenAI(base_url=…, api_key=token, model=…)` bound to a tool
makes a call whose arguments validate, the call's answer sent back gets text, and
`with_structured_output(PydanticModel, method="json_schema")` returns a validated object — over
Chat Completions and over the Responses API (`use_responses_api=True`).

Nothing here may download anything: token counting (tiktoken, whose encodings are fetched
lazily) is never called, LangSmith tracing is off, and tests/sdk_real_models.rs runs this
program with proxies that lead nowhere for every host but the service's.

Environment:
  LMSP_BASE_URL  the service's base URL with /v1, e.g. http://127.0.0.1:8717/v1
  LMSP_TOKEN     an application's client token
  LMSP_MODEL     the model id SmolLM2 is registered under

Exits 0 when every check passed, non-zero otherwise.

Run: target/langchain-venv/bin/python tests/langchain/test_langchain.py
(the venv comes from scripts/langchain-deps).
"""

import importlib.metadata
import os
import sys
import unittest
from typing import Literal

import pydantic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI


def required_env(name):
    value = os.environ.get(name)
    if not value:
        sys.exit(f"{name} is not set: tests/sdk_real_models.rs sets it (see this file's doc)")
    return value


BASE_URL = required_env("LMSP_BASE_URL")
TOKEN = required_env("LMSP_TOKEN")
MODEL = required_env("LMSP_MODEL")


class GetWeather(pydantic.BaseModel):
    """The weather forecast of a city."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(min_length=1, max_length=30, description="The city")
    days: int = pydantic.Field(ge=1, le=7, description="How many days")


class Person(pydantic.BaseModel):
    """A person."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(min_length=1, max_length=24)
    age: int = pydantic.Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]


QUESTION = "What will the weather be in Paris this week?"


def chat_model(responses_api):
    """A ChatOpenAI on the service, greedy and short, as an application makes one."""
    return ChatOpenAI(base_url=BASE_URL, api_key=TOKEN, model=MODEL, temperature=0,
                      max_tokens=60, max_retries=0, timeout=120,
                      use_responses_api=responses_api)


class LangChain(unittest.TestCase):
    def tool_loop(self, responses_api):
        llm = chat_model(responses_api)
        calling = llm.bind_tools([GetWeather], tool_choice="GetWeather", strict=True)
        question = HumanMessage(QUESTION)
        called = calling.invoke([question])
        self.assertIsInstance(called, AIMessage)
        self.assertEqual(len(called.tool_calls), 1, called)
        call = called.tool_calls[0]
        self.assertEqual(call["name"], "GetWeather", call)
        self.assertIsInstance(GetWeather.model_validate(call["args"]), GetWeather)
        self.assertTrue(call["id"].startswith("call_"), call)
        answering = llm.bind_tools([GetWeather], tool_choice="none")
        answer = answering.invoke([
            question, called,
            ToolMessage('{"forecast": "sunny", "celsius": 21}', tool_call_id=call["id"]),
        ])
        self.assertFalse(answer.tool_calls, answer)
        self.assertTrue(answer.text.strip(), answer)

    def test_01_bind_tools_chat(self):
        """bind_tools (Chat Completions): a named tool's call, arguments valid; its ToolMessage
        sent back gets a text answer."""
        self.tool_loop(responses_api=False)

    def test_02_bind_tools_responses(self):
        """bind_tools with use_responses_api=True: the same loop over the Responses API."""
        self.tool_loop(responses_api=True)

    def test_03_structured_output(self):
        """with_structured_output(Person, method="json_schema") returns a Person, over both
        APIs."""
        for responses_api in (False, True):
            structured = chat_model(responses_api).with_structured_output(
                Person, method="json_schema", strict=True)
            person = structured.invoke("Describe a person as JSON.")
            self.assertIsInstance(person, Person, responses_api)


if __name__ == "__main__":
    versions = {name: importlib.metadata.version(name)
                for name in ("langchain-openai", "langchain-core", "openai")}
    print(f"{versions} against {BASE_URL} (model {MODEL})", flush=True)
    unittest.main(verbosity=2)
