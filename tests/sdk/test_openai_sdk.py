#!/usr/bin/env python3
"""The official OpenAI Python SDK (pinned in requirements.txt beside this file) against a running
LMSP service: every OpenAI-compatible call that an application makes, each answer checked
field by field against the SDK's own types (validated, not just constructed).

Environment:
  LMSP_BASE_URL     the service's base URL with /v1, e.g. http://127.0.0.1:8717/v1
  LMSP_TOKEN        an application's client token (responses:write, responses:read, models:read)
  LMSP_ADMIN_TOKEN  an admin token: registers the model file the failure case needs
  LMSP_MODELS_DIR   the service's --models-dir (that file is written there, then removed)
  LMSP_CONTROL_DIR  where the program asks the Rust test for a kill -9 and restart (see below)
  LMSP_SLOW_BASE_URL, LMSP_SLOW_TOKEN
                    a second service, run with `--workers 1 --reference-cancel-delay 3s`, and an
                    application's token for it: there a response waits `queued` behind a running
                    one, and a cancelled one stays `cancelling` for a while

The service must run the reference engine with a per-token delay (e.g.
--reference-token-delay 10ms), so that a long response is still running when it is cancelled.
tests/openai_sdk.rs starts such a service and runs this program; it exits 0 when
every check passed.

Run: target/openai-sdk-venv/bin/python tests/sdk/test_openai_sdk.py [-v]
(the venv comes from scripts/openai-sdk-deps).
"""

import http.server as http_server
import json
import os
import sys
import threading
import time
import unittest
import uuid

import httpx2
import openai
import pydantic
from openai import OpenAI
from openai.types import Batch, FileObject, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseQueuedEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

ENV = (
    "LMSP_BASE_URL",
    "LMSP_TOKEN",
    "LMSP_ADMIN_TOKEN",
    "LMSP_MODELS_DIR",
    "LMSP_CONTROL_DIR",
    "LMSP_SLOW_BASE_URL",
    "LMSP_SLOW_TOKEN",
)
BASE_URL = os.environ.get("LMSP_BASE_URL", "")
TOKEN = os.environ.get("LMSP_TOKEN", "")
ADMIN_TOKEN = os.environ.get("LMSP_ADMIN_TOKEN", "")
MODELS_DIR = os.environ.get("LMSP_MODELS_DIR", "")
# Where the Rust test that runs this program listens for a request to kill -9 and restart the
# server (a file `restart`), and answers once the restarted server is healthy (`restarted`).
CONTROL_DIR = os.environ.get("LMSP_CONTROL_DIR", "")
# The second service: one worker, an engine that takes 3 s to stop after a cancel.
SLOW_BASE_URL = os.environ.get("LMSP_SLOW_BASE_URL", "")
SLOW_TOKEN = os.environ.get("LMSP_SLOW_TOKEN", "")

MODEL = "reference"
PROMPT = "Once upon a time"
SEED = 4242
TOKENS = 24
# A response that runs for minutes at the service's per-token delay: it is cancelled.
LONG = 100_000
DEADLINE = 60.0

# Every type a Responses stream of LMSP may carry, and the SDK's class for it.
EVENT_CLASSES = {
    "response.created": ResponseCreatedEvent,
    "response.queued": ResponseQueuedEvent,
    "response.in_progress": ResponseInProgressEvent,
    "response.output_item.added": ResponseOutputItemAddedEvent,
    "response.content_part.added": ResponseContentPartAddedEvent,
    "response.output_text.delta": ResponseTextDeltaEvent,
    "response.output_text.done": ResponseTextDoneEvent,
    "response.content_part.done": ResponseContentPartDoneEvent,
    "response.output_item.done": ResponseOutputItemDoneEvent,
    "response.completed": ResponseCompletedEvent,
    "response.failed": ResponseFailedEvent,
    "response.incomplete": ResponseIncompleteEvent,
    "error": ResponseErrorEvent,
}
LIFECYCLE = {
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.completed",
    "response.failed",
    "response.incomplete",
}
# The types a completed response's stream from the start does not carry.
ABSENT_WHEN_COMPLETED = {"response.queued", "response.failed", "response.incomplete", "error"}
# Log events OpenAI has no type for: left out of the OpenAI rendering.
NATIVE_ONLY = {"response.loading", "response.cancelling", "response.resumed"}


def sdk(token=None, base_url=None, **options):
    """An SDK client, as an application makes one."""
    options.setdefault("max_retries", 2)
    options.setdefault("timeout", DEADLINE)
    return OpenAI(base_url=base_url or BASE_URL, api_key=token or TOKEN, **options)


def http(token=None, base_url=None):
    """A plain HTTP client (the SDK's own httpx2) for LMSP's native API."""
    return httpx2.Client(
        base_url=(base_url or BASE_URL).rstrip("/") + "/",
        headers={"Authorization": f"Bearer {token or TOKEN}"},
        timeout=DEADLINE,
    )


def lmsp_error_codes_as_openai(value):
    """A copy of `value` in which a response object's `error.code`, one of LMSP's task error
    codes (`model_unavailable`, …), reads `server_error`: the SDK types that field as the
    literal codes of OpenAI's own failures. LMSP keeps its codes there (docs/openai-sdk.md);
    the SDK constructs them unchanged, as a str."""
    if isinstance(value, list):
        return [lmsp_error_codes_as_openai(item) for item in value]
    if not isinstance(value, dict):
        return value
    copy = {key: lmsp_error_codes_as_openai(item) for key, item in value.items()}
    if copy.get("object") == "response" and isinstance(copy.get("error"), dict):
        copy["error"] = {**copy["error"], "code": "server_error"}
    return copy


def validated(cls, obj):
    """Validates what the SDK built (it constructs without validating) against its type."""
    return cls.model_validate(lmsp_error_codes_as_openai(obj.to_dict()))


def wait_for(what, probe, deadline=DEADLINE):
    """Polls `probe` until it returns something truthy; fails with the last value seen."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last saw {last!r}")


def all_tasks(client):
    """Every task this client sees, via GET /v1/tasks (newest first, paged with `after`)."""
    tasks, after = [], None
    while True:
        params = {"limit": 100}
        if after:
            params["after"] = after
        reply = client.get("tasks", params=params)
        reply.raise_for_status()
        page = reply.json()
        assert page["object"] == "list", page
        tasks.extend(page["data"])
        if not page["has_more"]:
            return tasks
        after = page["data"][-1]["id"]


def native_events(client, task_id):
    """The task's stored log, via GET /v1/tasks/{id}/events."""
    events, after = [], 0
    while True:
        reply = client.get(f"tasks/{task_id}/events", params={"after": after, "limit": 1000})
        reply.raise_for_status()
        page = reply.json()
        events.extend(page["data"])
        if not page["has_more"]:
            return events
        after = page["data"][-1]["sequence_number"]


def pair_application(admin, name):
    """Pairs another client with an application's scopes, as `lmsp` pairing does; its token."""
    scopes = ["responses:write", "responses:read", "models:read"]
    pairing = admin.post("pairings", json={"scopes": scopes})
    pairing.raise_for_status()
    paired = admin.post("pair", json={"code": pairing.json()["code"], "name": name,
                                      "scopes": scopes})
    paired.raise_for_status()
    return paired.json()["token"]


def jsonl(lines):
    """Request lines as a JSONL file's bytes."""
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def strings_in(value):
    """Every string anywhere in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


class Receiver:
    """A webhook receiver: a real HTTP server on 127.0.0.1 that keeps every delivery (headers
    and body) and answers with the next of `answers` (then 200); an answer of None hangs for
    `hang` seconds before answering 200."""

    def __init__(self, answers=(), hang=30.0):
        self.deliveries = []
        self.answers = list(answers)
        self.hang = hang
        self.lock = threading.Lock()
        receiver = self

        class Handler(http_server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.deliveries.append((dict(self.headers.items()), body))
                    answer = receiver.answers.pop(0) if receiver.answers else 200
                if answer is None:
                    time.sleep(receiver.hang)
                    answer = 200
                self.send_response(answer)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http_server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def received(self):
        with self.lock:
            return list(self.deliveries)

    def events(self, secret):
        """Every delivery that verifies under `secret`, parsed by the SDK's webhooks.unwrap
        (deliveries signed under another secret, e.g. before a rotation, are left out)."""
        unwrapper = OpenAI(api_key="unused", base_url=BASE_URL, webhook_secret=secret)
        events = []
        for headers, body in self.received():
            try:
                events.append(unwrapper.webhooks.unwrap(body, headers))
            except openai.InvalidWebhookSignatureError:
                pass
        return events

    def wait_event(self, secret, predicate, deadline=DEADLINE):
        return wait_for("a webhook delivery",
                        lambda: next((e for e in self.events(secret) if predicate(e)), None),
                        deadline)


class OpenAiSdk(unittest.TestCase):
    """Each test names the SDK calls it makes."""

    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.client = sdk()
        cls.http = http()
        cls.admin = http(ADMIN_TOKEN)
        # A second application on the same service (paired first: test_17 locks pairing).
        cls.other = sdk(token=pair_application(cls.admin, "another application"))
        # The reference output for PROMPT/SEED/TOKENS, from a synchronous create.
        cls.reference = cls.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=TOKENS, extra_body={"seed": SEED}
        )

    @classmethod
    def tearDownClass(cls):
        cls.http.close()
        cls.admin.close()
        cls.client.close()
        cls.other.close()

    # ---- helpers that check a whole answer ----

    def check_response(self, response, status="completed", model=MODEL):
        """A response object: the SDK's type, OpenAI's fields, LMSP's own fields."""
        self.assertIsInstance(response, Response)
        validated(Response, response)
        raw = response.to_dict()
        self.assertTrue(response.id.startswith("resp_"), response.id)
        self.assertEqual(response.object, "response")
        self.assertEqual(response.status, status)
        self.assertEqual(response.model, model)
        self.assertIsInstance(response.created_at, (int, float))
        self.assertGreater(response.created_at, 1_600_000_000)
        self.assertEqual(response.tools, [])
        self.assertEqual(response.tool_choice, "auto")
        self.assertIsInstance(response.parallel_tool_calls, bool)
        self.assertTrue(raw["task_id"].startswith("task_"), raw)
        self.assertIn(raw["on_restart"], ("fail", "retry", "resume"))
        self.assertIsInstance(raw["seed"], int)
        self.assertIsInstance(raw["restarts"], int)
        if status == "completed":
            self.assertIsInstance(response.completed_at, (int, float))
            self.assertGreaterEqual(response.completed_at, response.created_at)
            self.assertEqual(len(response.output), 1, raw)
            message = response.output[0]
            self.assertEqual(message.type, "message")
            self.assertTrue(message.id.startswith("msg_"), message.id)
            self.assertEqual(message.role, "assistant")
            self.assertEqual(message.status, "completed")
            self.assertEqual(len(message.content), 1)
            part = message.content[0]
            self.assertEqual(part.type, "output_text")
            self.assertEqual(part.annotations, [])
            self.assertNotEqual(response.output_text, "")
            self.assertEqual(part.text, response.output_text)
            self.assertEqual(raw["output_text"], response.output_text)
            usage = response.usage
            self.assertGreater(usage.input_tokens, 0)
            self.assertGreater(usage.output_tokens, 0)
            self.assertLessEqual(usage.output_tokens, response.max_output_tokens)
            self.assertEqual(usage.total_tokens, usage.input_tokens + usage.output_tokens)
            self.assertEqual(usage.input_tokens_details.cached_tokens, 0)
            self.assertEqual(usage.output_tokens_details.reasoning_tokens, 0)
            self.assertIsNone(response.error)
        else:
            self.assertEqual(response.output, [])
            self.assertIsNone(response.usage)
        return raw

    def check_events(self, events, terminal="response.completed", first=1):
        """A Responses stream from sequence `first` on: every event is the SDK's own typed
        event for its type and validates; sequence numbers are the task log's (the events
        OpenAI has no type for left out); the lifecycle events carry the one response; the
        deltas joined are the final text. Returns (response id, task id, joined deltas)."""
        self.assertTrue(events, "the stream sent no event")
        seen_types = set()
        response_id = None
        for event in events:
            cls = EVENT_CLASSES.get(event.type)
            self.assertIsNotNone(cls, f"unexpected event type {event.type}")
            self.assertIs(type(event), cls, event.type)
            validated(cls, event)
            seen_types.add(event.type)
            if event.type in LIFECYCLE:
                self.assertIsInstance(event.response, Response, event.type)
                validated(Response, event.response)
                self.assertEqual(event.response.object, "response")
                response_id = response_id or event.response.id
                self.assertEqual(event.response.id, response_id, event.type)
        task_id = None
        for event in events:
            if event.type in LIFECYCLE:
                task_id = event.response.to_dict()["task_id"]
                break
        self.assertIsNotNone(task_id, "no event carried the response")
        # Sequence numbers: the log's, strictly increasing (the `error` event shares its
        # number with the `response.failed` after it), exactly the log's events OpenAI has a
        # type for.
        numbers = [e.sequence_number for e in events]
        for before, event in zip(events, events[1:]):
            if before.type == "error":
                self.assertEqual(event.type, "response.failed")
                self.assertEqual(event.sequence_number, before.sequence_number)
            else:
                self.assertGreater(event.sequence_number, before.sequence_number)
        log = native_events(self.http, task_id)
        expected = [e["sequence_number"] for e in log if e["type"] not in NATIVE_ONLY]
        expected = [n for n in expected if n >= first]
        self.assertEqual(
            [n for e, n in zip(events, numbers) if e.type != "error"], expected, "sequence numbers"
        )
        if first == 1:
            self.assertEqual(events[0].type, "response.created")
            self.assertEqual(events[0].sequence_number, 1)
            self.assertEqual(events[0].response.status, "queued")
        self.assertEqual(events[-1].type, terminal)
        self.assertEqual(events[-1].sequence_number, log[-1]["sequence_number"])
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        for before, delta in zip(deltas, deltas[1:]):
            self.assertEqual(delta.sequence_number, before.sequence_number + 1, "delta numbers")
        for delta in deltas:
            self.assertIsInstance(delta.delta, str)
            self.assertNotEqual(delta.delta, "")
            self.assertTrue(delta.item_id.startswith("msg_"), delta.item_id)
            self.assertEqual(delta.output_index, 0)
            self.assertEqual(delta.content_index, 0)
            self.assertEqual(delta.logprobs, [])
        text = "".join(d.delta for d in deltas)
        if terminal == "response.completed" and first == 1:
            by_type = {e.type: e for e in events}
            for kind in EVENT_CLASSES:
                if kind not in ABSENT_WHEN_COMPLETED:
                    self.assertIn(kind, seen_types)
            item_id = by_type["response.output_item.added"].item.id
            self.assertEqual(by_type["response.output_item.added"].item.status, "in_progress")
            self.assertEqual(by_type["response.output_item.added"].item.role, "assistant")
            self.assertEqual(by_type["response.content_part.added"].part.type, "output_text")
            self.assertEqual({d.item_id for d in deltas}, {item_id})
            self.assertEqual(by_type["response.output_text.done"].text, text)
            self.assertEqual(by_type["response.content_part.done"].part.text, text)
            done = by_type["response.output_item.done"].item
            self.assertEqual((done.id, done.status), (item_id, "completed"))
            self.assertEqual(done.content[0].text, text)
            final = by_type["response.completed"].response
            self.check_response(final)
            self.assertEqual(final.output_text, text)
            self.assertEqual(final.output[0].id, item_id)
            self.assertEqual(by_type["response.in_progress"].response.status, "in_progress")
        return response_id, task_id, text

    def background_running(self, **extra):
        """A long background response, once its task runs."""
        metadata = {"case": uuid.uuid4().hex}
        created = self.client.responses.create(
            model=MODEL,
            input=PROMPT,
            background=True,
            max_output_tokens=LONG,
            metadata=metadata,
            **extra,
        )
        wait_for(
            "the response to be in progress",
            lambda: self.client.responses.retrieve(created.id).status == "in_progress",
        )
        return created

    def wait_status(self, response_id, status, client=None):
        client = client or self.client
        return wait_for(
            f"{response_id} to be {status}",
            lambda: (lambda r: r if r.status == status else None)(
                client.responses.retrieve(response_id)
            ),
        )

    def vanishing_model(self):
        """A model registered (by the admin) whose file is removed at once: a task of it
        fails with model_unavailable when it loads."""
        model_id = f"vanishing-{uuid.uuid4().hex[:8]}"
        path = os.path.join(MODELS_DIR, f"{model_id}.txt")
        with open(path, "w", encoding="utf-8") as file:
            file.write("the file of a model that is gone before it is loaded\n" * 20)
        reply = self.admin.post("models", json={"id": model_id, "path": path})
        self.assertEqual(reply.status_code, 201, reply.text)
        os.remove(path)
        return model_id

    # ---- the calls ----

    def test_01_models_list(self):
        """models.list(), models.retrieve(): created and owned_by set; no file path for an
        application's token."""
        models = list(self.client.models.list())
        self.assertIn(MODEL, [m.id for m in models])
        for model in models:
            self.assertIsInstance(model, Model)
            validated(Model, model)
            self.assertEqual(model.object, "model")
            self.assertIsInstance(model.created, int)
            self.assertGreater(model.created, 1_600_000_000)
            self.assertIsInstance(model.owned_by, str)
            self.assertNotEqual(model.owned_by, "")
        raw = self.client.models.with_raw_response.list().http_response.json()
        one = self.client.models.with_raw_response.retrieve(MODEL).http_response.json()
        for value in strings_in([raw, one]):
            self.assertFalse(os.path.isabs(value), f"an absolute path in the JSON: {value}")
            self.assertNotIn(os.sep + "models" + os.sep, value)
        model = self.client.models.retrieve(MODEL)
        self.assertEqual((model.id, model.object), (MODEL, "model"))
        self.assertGreater(model.created, 1_600_000_000)

    def test_02_create_sync(self):
        """responses.create(): waits, 200, the completed response; same seed, same text."""
        raw = self.client.responses.with_raw_response.create(
            model=MODEL, input=PROMPT, max_output_tokens=TOKENS, extra_body={"seed": SEED}
        )
        self.assertEqual(raw.http_response.status_code, 200)
        response = raw.parse()
        fields = self.check_response(response)
        self.assertEqual(raw.headers["lmsp-task-id"], fields["task_id"])
        self.assertFalse(response.background)
        self.assertEqual(response.max_output_tokens, TOKENS)
        self.assertEqual(fields["seed"], SEED)
        self.assertEqual(response.output_text, self.reference.output_text)
        self.check_response(self.reference)
        # The same response again, by id.
        again = self.client.responses.retrieve(response.id)
        self.check_response(again)
        self.assertEqual(again.to_dict(), response.to_dict())

    def test_03_create_background(self):
        """responses.create(background=True): 202 queued at once, then retrieve() until
        completed; the same text as the synchronous create with the same seed."""
        raw = self.client.responses.with_raw_response.create(
            model=MODEL,
            input=PROMPT,
            background=True,
            max_output_tokens=TOKENS,
            extra_body={"seed": SEED},
        )
        self.assertEqual(raw.http_response.status_code, 202)
        created = raw.parse()
        fields = self.check_response(created, status="queued")
        self.assertTrue(created.id.startswith("resp_"))
        self.assertEqual(created.object, "response")
        self.assertTrue(created.background)
        self.assertEqual(raw.headers["location"], f"/v1/tasks/{fields['task_id']}")
        self.assertEqual(raw.headers["lmsp-task-id"], fields["task_id"])
        done = self.wait_status(created.id, "completed")
        self.check_response(done)
        self.assertEqual(done.id, created.id)
        self.assertTrue(done.background)
        self.assertNotEqual(done.output_text, "")
        self.assertEqual(done.output_text, self.reference.output_text)

    def test_04_create_stream(self):
        """responses.create(stream=True): OpenAI's typed events, the log's sequence numbers,
        the deltas joined equal to the final text and to the synchronous one."""
        with self.client.responses.create(
            model=MODEL,
            input=PROMPT,
            max_output_tokens=TOKENS,
            stream=True,
            extra_body={"seed": SEED},
        ) as stream:
            events = list(stream)
        response_id, _, text = self.check_events(events)
        self.assertEqual(text, self.reference.output_text)
        self.assertEqual(self.client.responses.retrieve(response_id).output_text, text)

    def test_05_stream_helper(self):
        """client.responses.stream(...): text deltas joined == get_final_response()'s text."""
        deltas, kinds = [], []
        with self.client.responses.stream(
            model=MODEL, input=PROMPT, max_output_tokens=TOKENS, extra_body={"seed": SEED}
        ) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
                    self.assertEqual(event.snapshot, "".join(deltas))
            final = stream.get_final_response()
        self.assertEqual(kinds[0], "response.created")
        self.assertEqual(kinds[-1], "response.completed")
        self.check_response(final)
        self.assertEqual("".join(deltas), final.output_text)
        self.assertEqual(final.output_text, self.reference.output_text)

    def test_06_retrieve_stream_resume(self):
        """responses.retrieve(id, stream=True, starting_after=N): exactly the events after N;
        and the helper responses.stream(response_id=…, starting_after=N)."""
        created = self.client.responses.create(
            model=MODEL,
            input=PROMPT,
            background=True,
            max_output_tokens=TOKENS,
            extra_body={"seed": SEED},
        )
        self.wait_status(created.id, "completed")
        everything = list(self.client.responses.retrieve(created.id, stream=True))
        _, _, text = self.check_events(everything)
        self.assertEqual(text, self.reference.output_text)
        deltas = [e for e in everything if e.type == "response.output_text.delta"]
        for after in (0, deltas[0].sequence_number, deltas[len(deltas) // 2].sequence_number):
            rest = list(
                self.client.responses.retrieve(created.id, stream=True, starting_after=after)
            )
            self.assertEqual(
                [e.to_dict() for e in rest],
                [e.to_dict() for e in everything if e.sequence_number > after],
                f"starting_after={after}",
            )
            self.check_events(rest, first=after + 1)
        last = everything[-1].sequence_number
        self.assertEqual(
            list(self.client.responses.retrieve(created.id, stream=True, starting_after=last)), []
        )
        middle = deltas[len(deltas) // 2].sequence_number
        with self.client.responses.stream(response_id=created.id, starting_after=middle) as stream:
            seen = list(stream)
            final = stream.get_final_response()
        self.assertTrue(all(e.sequence_number > middle for e in seen))
        self.assertEqual(seen[-1].type, "response.completed")
        self.check_response(final)
        self.assertEqual(final.output_text, text)

    def test_07_resume_live_stream(self):
        """A stream dropped while the response runs, resumed with starting_after: every event
        exactly once, the joined text equal to the final one."""
        created = self.client.responses.create(
            model=MODEL, input=PROMPT, background=True, max_output_tokens=400
        )
        first = []
        stream = self.client.responses.retrieve(created.id, stream=True)
        for event in stream:
            first.append(event)
            if sum(e.type == "response.output_text.delta" for e in first) == 3:
                break
        stream.close()
        self.assertNotEqual(first[-1].type, "response.completed", "the response finished too fast")
        rest = list(
            self.client.responses.retrieve(
                created.id, stream=True, starting_after=first[-1].sequence_number
            )
        )
        _, _, text = self.check_events(first + rest)
        done = self.client.responses.retrieve(created.id)
        self.check_response(done)
        self.assertEqual(done.output_text, text)

    def test_08_cancel(self):
        """responses.cancel(id) on a running background response: it ends cancelled; its
        stream ends with the response in status cancelled; a second cancel answers it."""
        created = self.background_running()
        cancelled = self.client.responses.cancel(created.id)
        self.assertIsInstance(cancelled, Response)
        validated(Response, cancelled)
        self.assertEqual(cancelled.id, created.id)
        # The cancel waited for the engine to stop (up to 1 s; it takes milliseconds here), so
        # the object it returns shows the end, not a response that still seems to run.
        self.assertEqual(cancelled.status, "cancelled")
        final = self.wait_status(created.id, "cancelled")
        self.check_response(final, status="cancelled")
        again = self.client.responses.cancel(created.id)
        self.assertEqual(again.status, "cancelled")
        events = list(self.client.responses.retrieve(created.id, stream=True))
        self.check_events(events, terminal="response.incomplete")
        self.assertEqual(events[-1].response.status, "cancelled")
        self.assertEqual(events[-1].response.id, created.id)
        # A finished, completed response cannot be cancelled: 409, the SDK's ConflictError.
        with self.assertRaises(openai.ConflictError) as caught:
            self.client.with_options(max_retries=0).responses.cancel(self.reference.id)
        self.assertEqual(caught.exception.code, "task_not_cancellable")

    def test_08a_cancel_queued_and_cancelling(self):
        """responses.cancel(id) of a queued response: 200, cancelled at once (it never ran);
        of a response being cancelled (its worker still stopping): 202 again, in_progress,
        until it ends cancelled. On the second service: one worker, 6 s to stop, longer than
        the 1 s a cancel of a running response waits for it."""
        slow = sdk(token=SLOW_TOKEN, base_url=SLOW_BASE_URL, max_retries=0)
        slow_http = http(SLOW_TOKEN, SLOW_BASE_URL)
        self.addCleanup(slow.close)
        self.addCleanup(slow_http.close)
        running = slow.responses.create(
            model=MODEL, input=PROMPT, background=True, max_output_tokens=LONG
        )
        self.wait_status(running.id, "in_progress", client=slow)
        queued = slow.responses.create(
            model=MODEL, input=PROMPT, background=True, max_output_tokens=TOKENS
        )
        self.assertEqual(slow.responses.retrieve(queued.id).status, "queued", "one worker, busy")

        raw = slow.responses.with_raw_response.cancel(queued.id)
        self.assertEqual(raw.http_response.status_code, 200)
        cancelled = raw.parse()
        self.check_response(cancelled, status="cancelled")
        self.assertEqual(cancelled.id, queued.id)
        self.assertEqual(slow.responses.retrieve(queued.id).status, "cancelled")
        events = list(slow.responses.retrieve(queued.id, stream=True))
        self.assertEqual(
            [e.type for e in events], ["response.created", "response.incomplete"], "it never ran"
        )
        self.assertEqual(events[-1].response.status, "cancelled")

        first = slow.responses.with_raw_response.cancel(running.id)
        second = slow.responses.with_raw_response.cancel(running.id)
        self.assertEqual(first.http_response.status_code, 202)
        self.assertEqual(second.http_response.status_code, 202, "cancelling: 202 again")
        for reply in (first, second):
            response = reply.parse()
            self.check_response(response, status="in_progress")
            self.assertEqual(response.id, running.id)
        task = slow_http.get(f"tasks/{running.to_dict()['task_id']}").json()
        self.assertEqual(task["status"], "cancelling", task)
        done = self.wait_status(running.id, "cancelled", client=slow)
        self.check_response(done, status="cancelled")
        again = slow.responses.with_raw_response.cancel(running.id)
        self.assertEqual(again.http_response.status_code, 200)
        self.assertEqual(again.parse().status, "cancelled")

    def test_08b_cancel_failed(self):
        """responses.cancel(id) of a failed response: 409 task_not_cancellable, the SDK's
        ConflictError; the response stays failed."""
        model_id = self.vanishing_model()
        created = self.client.responses.create(
            model=model_id, input=PROMPT, background=True, max_output_tokens=TOKENS
        )
        failed = self.wait_status(created.id, "failed")
        self.assertEqual(failed.error.code, "model_unavailable")
        with self.assertRaises(openai.ConflictError) as caught:
            self.client.with_options(max_retries=0).responses.cancel(created.id)
        self.assertEqual(caught.exception.status_code, 409)
        self.assertEqual(caught.exception.code, "task_not_cancellable")
        self.assertEqual(caught.exception.type, "invalid_request_error")
        self.assertEqual(self.client.responses.retrieve(created.id).status, "failed")

    def test_09_delete(self):
        """responses.delete(id): a finished response goes (404 afterwards); an unfinished one
        is 409."""
        created = self.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=TOKENS, extra_body={"seed": SEED}
        )
        task_id = created.to_dict()["task_id"]
        self.assertIsNone(self.client.responses.delete(created.id))
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.responses.retrieve(created.id)
        self.assertEqual(caught.exception.status_code, 404)
        self.assertEqual(caught.exception.code, "not_found")
        self.assertEqual(caught.exception.type, "not_found_error")
        self.assertEqual(self.http.get(f"tasks/{task_id}").status_code, 404)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.delete(created.id)
        running = self.background_running()
        with self.assertRaises(openai.ConflictError) as caught:
            self.client.with_options(max_retries=0).responses.delete(running.id)
        self.assertEqual(caught.exception.status_code, 409)
        self.assertEqual(caught.exception.code, "task_not_finished")
        self.client.responses.cancel(running.id)
        self.wait_status(running.id, "cancelled")
        self.assertIsNone(self.client.responses.delete(running.id))

    def test_10_failed_sync_create_is_not_retried(self):
        """A synchronous create whose task fails: 500 with the task's error code and
        x-should-retry: false, so the SDK (max_retries=3) makes no second task."""
        model_id = self.vanishing_model()
        client = sdk(max_retries=3)
        before = len(all_tasks(self.http))
        with self.assertRaises(openai.InternalServerError) as caught:
            client.responses.create(model=model_id, input=PROMPT, max_output_tokens=TOKENS)
        error = caught.exception
        self.assertEqual(error.status_code, 500)
        self.assertEqual(error.code, "model_unavailable")
        self.assertEqual(error.type, "server_error")
        self.assertEqual(error.response.headers.get("x-should-retry"), "false")
        self.assertEqual(len(all_tasks(self.http)), before + 1, "the SDK retried into new tasks")
        task = self.http.get(f"tasks/{error.response.headers['lmsp-task-id']}").json()
        self.assertEqual((task["status"], task["error"]["code"]), ("failed", "model_unavailable"))
        # The same task's response, failed, through the SDK.
        failed = self.client.responses.retrieve(task["response_id"])
        self.check_response(failed, status="failed", model=model_id)
        self.assertEqual(failed.error.code, "model_unavailable")
        events = list(self.client.responses.retrieve(task["response_id"], stream=True))
        self.check_events(events, terminal="response.failed")
        self.assertEqual([e.type for e in events[-2:]], ["error", "response.failed"])
        self.assertEqual(events[-2].code, "model_unavailable")
        self.assertEqual(events[-1].response.error.code, "model_unavailable")
        # The same for a chat completion, streamed or not.
        before = len(all_tasks(self.http))
        messages = [{"role": "user", "content": PROMPT}]
        with self.assertRaises(openai.InternalServerError) as caught:
            client.chat.completions.create(model=model_id, messages=messages)
        self.assertEqual(caught.exception.code, "model_unavailable")
        self.assertEqual(caught.exception.response.headers.get("x-should-retry"), "false")
        with self.assertRaises(openai.APIError) as caught:
            list(client.chat.completions.create(model=model_id, messages=messages, stream=True))
        self.assertEqual(caught.exception.code, "model_unavailable")
        self.assertEqual(len(all_tasks(self.http)), before + 2, "the SDK retried into new tasks")

    def test_11_cancelled_sync_create_is_not_retried(self):
        """A synchronous create whose task is cancelled meanwhile: 409 task_cancelled with
        x-should-retry: false (the SDK retries other 409s), no second task."""
        client = sdk(max_retries=3)
        case = uuid.uuid4().hex
        before = len(all_tasks(self.http))
        outcome = {}

        def create():
            try:
                outcome["response"] = client.responses.create(
                    model=MODEL, input=PROMPT, max_output_tokens=LONG, metadata={"case": case}
                )
            except Exception as error:  # noqa: BLE001 — handed to the test thread
                outcome["error"] = error

        thread = threading.Thread(target=create)
        thread.start()
        task = wait_for(
            "the synchronous task to run",
            lambda: next(
                (
                    t
                    for t in all_tasks(self.http)
                    if t["metadata"].get("case") == case and t["status"] == "running"
                ),
                None,
            ),
        )
        self.client.responses.cancel(task["response_id"])
        thread.join(DEADLINE)
        self.assertFalse(thread.is_alive())
        error = outcome.get("error")
        self.assertIsInstance(error, openai.ConflictError, outcome)
        self.assertEqual(error.code, "task_cancelled")
        self.assertEqual(error.response.headers.get("x-should-retry"), "false")
        self.assertEqual(len(all_tasks(self.http)), before + 1)

    def test_12_parameters(self):
        """temperature, top_p, instructions, store, metadata, user, text, content parts,
        message items, the developer role, previous_response_id: accepted and echoed."""
        response = self.client.responses.create(
            model=MODEL,
            instructions="Tell a story.",
            input=[
                {"role": "developer", "content": "Keep it short."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": PROMPT}],
                },
            ],
            temperature=0.5,
            top_p=0.9,
            store=True,
            metadata={"case": "parameters"},
            user="sdk-test",
            text={"format": {"type": "text"}},
            max_output_tokens=16,
            extra_body={"seed": 7},
        )
        fields = self.check_response(response)
        self.assertEqual(response.temperature, 0.5)
        self.assertEqual(response.top_p, 0.9)
        self.assertEqual(response.instructions, "Tell a story.")
        self.assertEqual(response.metadata, {"case": "parameters"})
        self.assertIs(fields["store"], True)
        self.assertEqual(response.text.format.type, "text")
        self.assertEqual(fields["seed"], 7)
        # A content-part array is the same input as the string.
        parts = self.client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_text", "text": PROMPT}]}],
            max_output_tokens=TOKENS,
            extra_body={"seed": SEED},
        )
        plain = self.client.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": PROMPT}],
            max_output_tokens=TOKENS,
            extra_body={"seed": SEED},
        )
        self.check_response(parts)
        self.assertEqual(parts.output_text, plain.output_text)
        # A conversation continued from a response.
        follow = self.client.responses.create(
            model=MODEL,
            previous_response_id=response.id,
            input="And then?",
            max_output_tokens=16,
        )
        self.check_response(follow)
        self.assertEqual(follow.previous_response_id, response.id)
        # A conversation carried by the application: the earlier output items given back as
        # input, as OpenAI's guides do it (`input += response.output`).
        turn = self.client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": PROMPT},
                *parts.output,
                {"role": "user", "content": "And then?"},
            ],
            max_output_tokens=16,
        )
        self.check_response(turn)
        # What LMSP cannot do is a 400 naming the field, never ignored.
        for param, extra in (
            ("tools[0].type", {"tools": [{"type": "web_search"}]}),
            ("reasoning", {"reasoning": {"effort": "low"}}),
        ):
            with self.assertRaises(openai.BadRequestError) as caught:
                self.client.responses.create(model=MODEL, input=PROMPT, **extra)
            self.assertEqual(caught.exception.param, param)
            self.assertEqual(caught.exception.type, "invalid_request_error")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.responses.create(
                model=MODEL,
                input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            )
        self.assertEqual(caught.exception.param, "input[0].content[0].type")
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.responses.create(model="no-such-model", input=PROMPT)
        self.assertEqual(caught.exception.code, "model_not_found")

    def test_13_chat_completions(self):
        """chat.completions.create(), with and without stream (and include_usage): a task
        like any other; the stream's content joined equals the completion's."""
        messages = [
            {"role": "system", "content": "You tell stories."},
            {"role": "developer", "content": "Keep it short."},
            {"role": "user", "content": [{"type": "text", "text": PROMPT}]},
        ]
        raw = self.client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED
        )
        completion = raw.parse()
        self.assertIsInstance(completion, ChatCompletion)
        validated(ChatCompletion, completion)
        self.assertEqual(completion.object, "chat.completion")
        self.assertTrue(completion.id.startswith("chatcmpl-"), completion.id)
        self.assertEqual(completion.model, MODEL)
        self.assertGreater(completion.created, 1_600_000_000)
        self.assertEqual(len(completion.choices), 1)
        choice = completion.choices[0]
        self.assertEqual(choice.index, 0)
        self.assertEqual(choice.message.role, "assistant")
        self.assertTrue(choice.message.content)
        self.assertIn(choice.finish_reason, ("stop", "length"))
        usage = completion.usage
        self.assertGreater(usage.completion_tokens, 0)
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)
        task = self.http.get(f"tasks/{raw.headers['lmsp-task-id']}").json()
        self.assertEqual(task["status"], "completed")
        chunks = list(
            self.client.chat.completions.create(
                model=MODEL,
                messages=messages,
                max_completion_tokens=TOKENS,
                seed=SEED,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        for chunk in chunks:
            self.assertIsInstance(chunk, ChatCompletionChunk)
            validated(ChatCompletionChunk, chunk)
            self.assertEqual(chunk.object, "chat.completion.chunk")
            self.assertEqual(chunk.model, MODEL)
        self.assertEqual(len({c.id for c in chunks}), 1)
        with_choices = [c for c in chunks if c.choices]
        self.assertEqual(with_choices[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in with_choices)
        self.assertEqual(text, choice.message.content)
        finishes = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
        self.assertEqual(finishes, [choice.finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, usage.prompt_tokens)
        # Without include_usage no chunk carries it.
        plain = list(
            self.client.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED, stream=True
            )
        )
        self.assertTrue(all(c.usage is None for c in plain))
        plain_text = "".join(c.choices[0].delta.content or "" for c in plain if c.choices)
        self.assertEqual(plain_text, text)
        # The SDK's stream helper (which raises LengthFinishReasonError, with the completion,
        # when the output ran up to its budget).
        with self.client.chat.completions.stream(
            model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED
        ) as stream:
            try:
                final = stream.get_final_completion()
            except openai.LengthFinishReasonError as error:
                self.assertEqual(choice.finish_reason, "length")
                final = error.completion
        self.assertEqual(final.choices[0].message.content, text)
        self.assertEqual(final.choices[0].finish_reason, choice.finish_reason)

    def test_14_errors(self):
        """Errors as the SDK's exception classes, with code, param and type."""
        with self.assertRaises(openai.AuthenticationError) as caught:
            sdk(token="lmsp_not-a-token").models.list()
        self.assertEqual(caught.exception.type, "authentication_error")
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.responses.retrieve("resp_01J0000000000000000000000")
        self.assertEqual(caught.exception.code, "not_found")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=0)
        self.assertEqual(caught.exception.param, "max_output_tokens")

    def test_15_permission_denied(self):
        """A token without the scope: the SDK's PermissionDeniedError (403 forbidden)."""
        with self.assertRaises(openai.PermissionDeniedError) as caught:
            self.client.with_options(max_retries=0).models.delete("reference")
        self.assertEqual(caught.exception.code, "forbidden")

    def test_16_kill_and_restart_mid_stream_then_resume(self):
        """A kill -9 and restart of the server while the SDK streams a response with
        on_restart resume: resuming the SDK stream with starting_after gives every later event
        once, and the text the SDK assembled equals the response's output_text."""
        stream = self.client.responses.create(
            model=MODEL,
            input=PROMPT,
            background=True,
            stream=True,
            max_output_tokens=300,
            extra_body={"on_restart": "resume", "seed": SEED},
        )
        first = []
        for event in stream:
            first.append(event)
            if sum(e.type == "response.output_text.delta" for e in first) == 5:
                break
        stream.close()
        response_id = first[0].response.id
        restarted = os.path.join(CONTROL_DIR, "restarted")
        with open(os.path.join(CONTROL_DIR, "restart"), "w", encoding="utf-8"):
            pass
        wait_for("the server to restart", lambda: os.path.exists(restarted))
        os.remove(restarted)
        rest = list(
            self.client.responses.retrieve(
                response_id, stream=True, starting_after=first[-1].sequence_number
            )
        )
        numbers = [e.sequence_number for e in first + rest if e.type != "error"]
        self.assertEqual(len(numbers), len(set(numbers)), "an event came twice")
        self.assertEqual(rest[-1].type, "response.completed")
        text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
        done = self.client.responses.retrieve(response_id)
        self.assertEqual(done.status, "completed")
        self.assertEqual(done.output_text, text)
        task = self.http.get(f"tasks/{done.model_extra.get('task_id') or response_id.replace('resp_', 'task_', 1)}")
        self.assertEqual(task.status_code, 200, task.text)
        self.assertEqual(task.json()["restarts"], 1, task.text)

    def test_17_rate_limited(self):
        """Wrong pairing codes until the limit: the SDK's RateLimitError (429 rate_limited)
        with Retry-After. (Last: it locks pairing for ten minutes.)"""
        client = sdk(max_retries=0)
        body = {"code": "000-000", "name": "guess", "scopes": ["responses:read"]}
        for _ in range(5):
            with self.assertRaises(openai.AuthenticationError):
                client.post("/pair", body=body, cast_to=object)
        with self.assertRaises(openai.RateLimitError) as caught:
            client.post("/pair", body=body, cast_to=object)
        self.assertEqual(caught.exception.code, "rate_limited")
        self.assertIn("retry-after", caught.exception.response.headers)


    # ---- tools, structured outputs and sampling controls (issue 23) ----

    WEATHER = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }

    def test_18_tool_loop_responses(self):
        """responses.create with a function tool: a function_call output item, then its
        function_call_output sent back (echoing the earlier items, and through
        previous_response_id) gets a text answer; responses.stream shows the call's argument
        events and the same final call."""
        tools = [{"type": "function", "name": "get_weather", "description": "The weather",
                  "parameters": self.WEATHER, "strict": True}]
        question = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = self.client.responses.create(
            model=MODEL, input=question, tools=tools, tool_choice="required"
        )
        validated(Response, first)
        self.assertEqual(first.status, "completed")
        call = first.output[0]
        self.assertIsInstance(call, ResponseFunctionToolCall)
        self.assertEqual(call.type, "function_call")
        self.assertEqual(call.name, "get_weather")
        self.assertTrue(call.call_id.startswith("call_"), call.call_id)
        self.assertEqual(json.loads(call.arguments), {"city": "", "days": 1})
        answer = {"type": "function_call_output", "call_id": call.call_id,
                  "output": json.dumps({"celsius": 21})}
        # The earlier items echoed back, as the SDK's own objects.
        echoed = self.client.responses.create(
            model=MODEL, input=[*question, *first.output, answer], tools=tools,
            max_output_tokens=TOKENS,
        )
        validated(Response, echoed)
        self.assertEqual(echoed.output[0].type, "message")
        self.assertTrue(echoed.output_text)
        chained = self.client.responses.create(
            model=MODEL, previous_response_id=first.id, input=[answer], tools=tools,
            max_output_tokens=TOKENS,
        )
        self.assertEqual(chained.output[0].type, "message")
        self.assertTrue(chained.output_text)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.responses.create(
                model=MODEL, previous_response_id=first.id,
                input=[{**answer, "call_id": "call_unknown"}],
            )
        self.assertEqual(caught.exception.param, "input[0].call_id")
        deltas = []
        with self.client.responses.stream(
            model=MODEL, input=question, tools=tools, tool_choice="required"
        ) as stream:
            for event in stream:
                if event.type == "response.function_call_arguments.delta":
                    self.assertIsInstance(event, ResponseFunctionCallArgumentsDeltaEvent)
                    deltas.append(event.delta)
                if event.type == "response.function_call_arguments.done":
                    self.assertIsInstance(event, ResponseFunctionCallArgumentsDoneEvent)
                    self.assertEqual(event.arguments, call.arguments)
            final = stream.get_final_response()
        self.assertEqual("".join(deltas), call.arguments)
        self.assertEqual(final.output[0].arguments, call.arguments)

    def test_19_tool_loop_chat(self):
        """chat.completions.create with tools: tool_calls and finish_reason tool_calls; the
        assistant message and a tool message sent back get text; the stream helper joins the
        streamed arguments into the same call."""
        tools = [{"type": "function", "function": {"name": "get_weather",
                  "parameters": self.WEATHER, "strict": True}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        first = self.client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        validated(ChatCompletion, first)
        choice = first.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        call = choice.message.tool_calls[0]
        self.assertEqual(call.type, "function")
        self.assertEqual(call.function.name, "get_weather")
        self.assertEqual(json.loads(call.function.arguments), {"city": "", "days": 1})
        follow = self.client.chat.completions.create(
            model=MODEL,
            messages=[*messages, choice.message,
                      {"role": "tool", "tool_call_id": call.id, "content": "21 degrees"}],
            tools=tools,
            max_completion_tokens=TOKENS,
        )
        validated(ChatCompletion, follow)
        self.assertIn(follow.choices[0].finish_reason, ("stop", "length"))
        self.assertTrue(follow.choices[0].message.content)
        chunks = list(self.client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, stream=True))
        for chunk in chunks:
            validated(ChatCompletionChunk, chunk)
        arguments = "".join(
            c.choices[0].delta.tool_calls[0].function.arguments or ""
            for c in chunks if c.choices and c.choices[0].delta.tool_calls
        )
        self.assertEqual(arguments, call.function.arguments)
        with self.client.chat.completions.stream(
            model=MODEL, messages=messages, tools=tools
        ) as stream:
            final = stream.get_final_completion()
        self.assertEqual(final.choices[0].message.tool_calls[0].function.arguments,
                         call.function.arguments)
        self.assertEqual(final.choices[0].finish_reason, "tool_calls")

    def test_20_structured_outputs_parse(self):
        """responses.parse(text_format=…) and chat.completions.parse(response_format=…) return
        parsed pydantic objects; a pydantic function tool's arguments are parsed too."""

        class Person(pydantic.BaseModel):
            name: str
            age: int
            tags: list[str]

        class GetWeather(pydantic.BaseModel):
            city: str
            days: int

        parsed = self.client.responses.parse(model=MODEL, input="Describe a person",
                                             text_format=Person)
        self.assertIsInstance(parsed.output_parsed, Person)
        self.assertEqual(parsed.output_parsed, Person(name="", age=0, tags=[]))
        completion = self.client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Describe a person"}],
            response_format=Person,
        )
        self.assertIsInstance(completion.choices[0].message.parsed, Person)
        called = self.client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
            tools=[openai.pydantic_function_tool(GetWeather)], tool_choice="required",
        )
        arguments = called.choices[0].message.tool_calls[0].function.parsed_arguments
        self.assertIsInstance(arguments, GetWeather)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.responses.create(
                model=MODEL, input="x", tools=[{"type": "web_search"}])
        self.assertEqual(caught.exception.param, "tools[0].type")

    def test_21_stop(self):
        """chat.completions.create(stop=…): the content ends before the first stop string."""
        messages = [{"role": "user", "content": PROMPT}]
        full = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED)
        text = full.choices[0].message.content
        words = text.split()
        stop = f" {words[3]} "
        stopped = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED,
            stop=[stop])
        self.assertEqual(stopped.choices[0].message.content, text[: text.index(stop)])
        # The generation ends at the token that completes the stop string (one word a token).
        self.assertEqual(full.choices[0].finish_reason, "length")
        self.assertEqual(stopped.choices[0].finish_reason, "stop")
        ended = len(text[: text.index(stop) + len(stop)].split())
        self.assertLess(ended, TOKENS)
        self.assertEqual(stopped.usage.completion_tokens, ended)
        # The SDK's streaming helper takes it as a complete answer (a `length` ending would
        # raise LengthFinishReasonError).
        with self.client.chat.completions.stream(
            model=MODEL, messages=messages, max_completion_tokens=TOKENS, seed=SEED, stop=[stop]
        ) as stream:
            final = stream.get_final_completion()
        self.assertEqual(final.choices[0].finish_reason, "stop")
        self.assertEqual(final.choices[0].message.content, text[: text.index(stop)])
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model=MODEL, messages=messages, stop=["a", "b", "c", "d", "e"])
        self.assertEqual(caught.exception.param, "stop")

    def test_22_logprobs(self):
        """Chat logprobs + top_logprobs (whole and streamed) and Responses
        include=["message.output_text.logprobs"]: a log probability per token."""
        messages = [{"role": "user", "content": PROMPT}]
        completion = self.client.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=6, seed=SEED,
            logprobs=True, top_logprobs=2)
        validated(ChatCompletion, completion)
        content = completion.choices[0].logprobs.content
        self.assertEqual(len(content), 6)
        self.assertEqual("".join(t.token for t in content), completion.choices[0].message.content)
        for token in content:
            self.assertLessEqual(token.logprob, 0.0)
            self.assertLessEqual(len(token.top_logprobs), 2)
        streamed = [
            token
            for chunk in self.client.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=6, seed=SEED,
                logprobs=True, top_logprobs=2, stream=True)
            if chunk.choices and chunk.choices[0].logprobs
            for token in chunk.choices[0].logprobs.content
        ]
        self.assertEqual([t.token for t in streamed], [t.token for t in content])
        response = self.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=6, extra_body={"seed": SEED},
            include=["message.output_text.logprobs"], top_logprobs=2)
        validated(Response, response)
        self.assertEqual(len(response.output[0].content[0].logprobs), 6)
        events = list(self.client.responses.create(
            model=MODEL, input=PROMPT, max_output_tokens=6, extra_body={"seed": SEED},
            include=["message.output_text.logprobs"], top_logprobs=2, stream=True))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        self.assertTrue(all(len(e.logprobs) == 1 for e in deltas), deltas)


    # ---- files and batches (issue 24) ----

    ENDED = ("completed", "failed", "expired", "cancelled")

    def wait_batch(self, batch_id, client=None, statuses=ENDED, deadline=120.0):
        """Polls batches.retrieve until the batch is in one of `statuses`."""
        client = client or self.client

        def probe():
            batch = client.batches.retrieve(batch_id)
            return batch if batch.status in statuses else None

        return wait_for(f"batch {batch_id} in {statuses}", probe, deadline)

    def file_lines(self, file_id, client=None):
        """The JSON lines of an output or error file (none without a file)."""
        if file_id is None:
            return []
        text = (client or self.client).files.content(file_id).text
        return [json.loads(line) for line in text.splitlines() if line]

    def batch_tasks(self, batch_id):
        return [t for t in all_tasks(self.http) if t.get("batch_id") == batch_id]

    def test_23_batch_responses(self):
        """files.create(purpose="batch") + batches.create + batches.retrieve until completed +
        files.content(output_file_id): one output line per request, each body the response the
        endpoint answers synchronously; files.list / files.retrieve; each line's task is listed
        under /v1/tasks with its batch_id and custom_id, at the flex tier."""
        bodies = {
            f"resp-{i}": {"model": MODEL, "input": f"{PROMPT} {i}", "max_output_tokens": 8,
                          "seed": SEED + i}
            for i in range(12)
        }
        data = jsonl({"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                      "body": body} for custom_id, body in bodies.items())
        file = self.client.files.create(file=("requests.jsonl", data), purpose="batch")
        validated(FileObject, file)
        self.assertTrue(file.id.startswith("file-"), file.id)
        self.assertEqual((file.purpose, file.bytes, file.filename),
                         ("batch", len(data), "requests.jsonl"))
        self.assertEqual(self.client.files.retrieve(file.id).id, file.id)
        self.assertIn(file.id, [f.id for f in self.client.files.list()])
        self.assertEqual(self.client.files.content(file.id).content, data)
        batch = self.client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                           completion_window="24h", metadata={"job": "test"})
        validated(Batch, batch)
        self.assertTrue(batch.id.startswith("batch_"), batch.id)
        self.assertEqual((batch.status, batch.input_file_id, batch.metadata),
                         ("validating", file.id, {"job": "test"}))
        done = self.wait_batch(batch.id)
        validated(Batch, done)
        self.assertEqual(done.status, "completed", done)
        counts = done.request_counts
        self.assertEqual((counts.total, counts.completed, counts.failed), (12, 12, 0))
        self.assertIsNone(done.error_file_id)
        self.assertIsNotNone(done.completed_at)
        output = self.client.files.retrieve(done.output_file_id)
        self.assertEqual(output.purpose, "batch_output")
        lines = self.file_lines(done.output_file_id)
        self.assertEqual(sorted(line["custom_id"] for line in lines), sorted(bodies))
        for line in lines:
            self.assertTrue(line["id"].startswith("batch_req_"), line)
            self.assertIsNone(line["error"])
            self.assertEqual(line["response"]["status_code"], 200)
            answered = Response.model_validate(lmsp_error_codes_as_openai(line["response"]["body"]))
            body = bodies[line["custom_id"]]
            sync = self.client.responses.create(
                model=MODEL, input=body["input"], max_output_tokens=8,
                extra_body={"seed": body["seed"]})
            self.assertEqual(answered.status, "completed")
            self.assertEqual(answered.output_text, sync.output_text)
            self.assertEqual(answered.usage.output_tokens, sync.usage.output_tokens)
            self.assertEqual(answered.background, sync.background)
        tasks = self.batch_tasks(batch.id)
        self.assertEqual(sorted(t["custom_id"] for t in tasks), sorted(bodies))
        self.assertTrue(all(t["service_tier"] == "flex" for t in tasks), tasks)
        self.assertIn(batch.id, [b.id for b in self.client.batches.list(limit=100)])

    def test_24_batch_chat_completions(self):
        """A batch for /v1/chat/completions: each output body is the chat.completion the
        endpoint answers synchronously."""
        bodies = {
            f"chat-{i}": {"model": MODEL, "messages": [{"role": "user", "content": f"Hi {i}"}],
                          "max_completion_tokens": 6, "seed": SEED + i}
            for i in range(6)
        }
        data = jsonl({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                      "body": body} for custom_id, body in bodies.items())
        file = self.client.files.create(file=("chat.jsonl", data), purpose="batch")
        batch = self.client.batches.create(input_file_id=file.id,
                                           endpoint="/v1/chat/completions",
                                           completion_window="24h")
        done = self.wait_batch(batch.id)
        self.assertEqual(done.status, "completed", done)
        lines = self.file_lines(done.output_file_id)
        self.assertEqual(sorted(line["custom_id"] for line in lines), sorted(bodies))
        for line in lines:
            answered = ChatCompletion.model_validate(line["response"]["body"])
            body = bodies[line["custom_id"]]
            sync = self.client.chat.completions.create(
                model=MODEL, messages=body["messages"], max_completion_tokens=6,
                seed=body["seed"])
            self.assertEqual(answered.choices[0].message.content,
                             sync.choices[0].message.content)
            self.assertEqual(answered.object, "chat.completion")

    def test_25_batch_refused_and_files_isolated(self):
        """A file with bad lines: the batch is failed with errors.data naming each line (from
        1), and no task exists for it. An unknown file id and another client's file: the SDK's
        NotFoundError; another client sees neither the file nor the batch. A purpose other than
        batch: BadRequestError. files.delete."""
        good = {"custom_id": "ok", "method": "POST", "url": "/v1/responses",
                "body": {"model": MODEL, "input": PROMPT}}
        data = b"".join([
            jsonl([good]),
            b"this is not json\n",
            jsonl([{**good, "custom_id": "ok"}]),
            jsonl([{**good, "custom_id": "chat", "url": "/v1/chat/completions"}]),
            jsonl([{**good, "custom_id": "zero", "body": {"model": MODEL, "input": PROMPT,
                                                          "max_output_tokens": 0}}]),
            jsonl([{**good, "custom_id": "nomodel", "body": {"model": "no-such-model",
                                                             "input": PROMPT}}]),
            jsonl([{**good, "custom_id": "get", "method": "GET"}]),
            # A good line whose custom_id a line refused for its body took.
            jsonl([{**good, "custom_id": "zero"}]),
        ])
        file = self.client.files.create(file=("bad.jsonl", data), purpose="batch")
        batch = self.client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                           completion_window="24h")
        failed = self.wait_batch(batch.id)
        validated(Batch, failed)
        self.assertEqual(failed.status, "failed", failed)
        errors = {(e.line, e.code) for e in failed.errors.data}
        self.assertEqual(errors, {
            (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "invalid_url"),
            (5, "invalid_request"), (6, "invalid_request"), (7, "invalid_method"),
            (8, "duplicate_custom_id"),
        })
        params = {e.line: e.param for e in failed.errors.data}
        self.assertEqual(params[5], "body.max_output_tokens")
        self.assertEqual(params[6], "body.model")
        self.assertEqual(failed.request_counts.total, 0)
        self.assertEqual(self.batch_tasks(batch.id), [])
        with self.assertRaises(openai.NotFoundError):
            self.client.batches.create(input_file_id="file-01J00000000000000000000000",
                                       endpoint="/v1/responses", completion_window="24h")
        with self.assertRaises(openai.NotFoundError):
            self.other.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                      completion_window="24h")
        with self.assertRaises(openai.NotFoundError):
            self.other.files.retrieve(file.id)
        with self.assertRaises(openai.NotFoundError):
            self.other.files.content(file.id)
        with self.assertRaises(openai.NotFoundError):
            self.other.batches.retrieve(batch.id)
        self.assertNotIn(file.id, [f.id for f in self.other.files.list()])
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.files.create(file=("x.jsonl", data), purpose="assistants")
        self.assertEqual(caught.exception.param, "purpose")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                       completion_window="24h")
        self.assertEqual(caught.exception.param, "endpoint")
        deleted = self.client.files.delete(file.id)
        self.assertTrue(deleted.deleted)
        with self.assertRaises(openai.NotFoundError):
            self.client.files.retrieve(file.id)

    def long_lines(self, count, tokens=400):
        return jsonl({"custom_id": f"long-{i}", "method": "POST", "url": "/v1/responses",
                      "body": {"model": MODEL, "input": PROMPT, "max_output_tokens": tokens,
                               "seed": i}}
                     for i in range(count))

    def check_answered_once(self, done, count, client=None):
        """Every line answered exactly once across the output and error files, and the
        counts are those lines."""
        output = self.file_lines(done.output_file_id, client)
        errors = self.file_lines(done.error_file_id, client)
        ids = [line["custom_id"] for line in output + errors]
        self.assertEqual(len(ids), count, "a line was answered twice or not at all")
        self.assertEqual(len(set(ids)), count, "a line was answered twice")
        counts = done.request_counts
        self.assertEqual((counts.total, counts.completed, counts.failed),
                         (count, len(output), len(errors)))
        return output, errors

    def test_26_batch_cancel(self):
        """batches.cancel mid-batch (one worker, so the lines run one by one): cancelling, then
        cancelled; the lines that finished are in the output file, the others in the error file
        with batch_cancelled."""
        client = sdk(SLOW_TOKEN, SLOW_BASE_URL)
        file = client.files.create(file=("long.jsonl", self.long_lines(5, tokens=40)),
                                   purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                      completion_window="24h")
        wait_for("a first line to finish",
                 lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1,
                 deadline=120.0)
        # A finished line's response stays while its batch runs: the batch's files are
        # written from its tasks (P-6: nothing its batch still needs is removed).
        slow_http = http(SLOW_TOKEN, SLOW_BASE_URL)
        done_line = next(t for t in all_tasks(slow_http)
                         if t.get("batch_id") == batch.id and t["status"] == "completed")
        slow_http.close()
        with self.assertRaises(openai.ConflictError):
            client.with_options(max_retries=0).responses.delete(done_line["response_id"])
        cancelling = client.batches.cancel(batch.id)
        self.assertIn(cancelling.status, ("cancelling", "cancelled"))
        done = self.wait_batch(batch.id, client)
        self.assertEqual(done.status, "cancelled", done)
        self.assertIsNotNone(done.cancelled_at)
        output, errors = self.check_answered_once(done, 5, client)
        self.assertGreaterEqual(len(output), 1)
        self.assertGreaterEqual(len(errors), 1)
        for line in errors:
            self.assertEqual(line["error"]["code"], "batch_cancelled", line)
            self.assertIsNone(line["response"])
        self.assertEqual(client.batches.cancel(batch.id).status, "cancelled")

    def test_27_batch_expires(self):
        """A completion window that passes: the unfinished lines are cancelled, the batch is
        expired, the finished lines kept."""
        client = sdk(SLOW_TOKEN, SLOW_BASE_URL)
        file = client.files.create(file=("long.jsonl", self.long_lines(4, tokens=150)),
                                   purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                      completion_window="3s")
        self.assertEqual(batch.completion_window, "3s")
        done = self.wait_batch(batch.id, client)
        self.assertEqual(done.status, "expired", done)
        self.assertIsNotNone(done.expired_at)
        _, errors = self.check_answered_once(done, 4, client)
        self.assertGreaterEqual(len(errors), 1)
        self.assertTrue(all(line["error"]["code"] == "batch_expired" for line in errors), errors)

    def test_28_batch_survives_kill_9(self):
        """kill -9 of the server at three moments of a 500-line batch, each followed by a
        restart: every custom_id is answered exactly once, and the counts are the lines."""
        count = 500
        data = jsonl({"custom_id": f"k-{i}", "method": "POST", "url": "/v1/responses",
                      "body": {"model": MODEL, "input": PROMPT, "max_output_tokens": 3,
                               "seed": i, "on_restart": ["resume", "retry", "fail"][i % 3]}}
                     for i in range(count))
        file = self.client.files.create(file=("kill.jsonl", data), purpose="batch")
        batch = self.client.batches.create(input_file_id=file.id, endpoint="/v1/responses",
                                           completion_window="24h")
        restarted = os.path.join(CONTROL_DIR, "restarted")
        rng = __import__("random").Random(SEED)
        for _ in range(3):
            time.sleep(rng.uniform(0.05, 1.5))
            with open(os.path.join(CONTROL_DIR, "restart"), "w", encoding="utf-8"):
                pass
            wait_for("the server to restart", lambda: os.path.exists(restarted))
            os.remove(restarted)
        done = self.wait_batch(batch.id, deadline=300.0)
        self.assertEqual(done.status, "completed", done)
        output, errors = self.check_answered_once(done, count)
        for line in errors:
            # Only a line whose policy is fail, running at a kill, fails.
            self.assertEqual(line["response"]["body"]["error"]["code"], "server_restarted", line)


    def test_29_input_items(self):
        """responses.input_items.list: the request's messages as OpenAI's input items, newest
        first by default, oldest first with order="asc", paged with after/limit."""
        messages = [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "First question"},
            {"role": "assistant", "content": "First answer"},
            {"role": "user", "content": "Second question"},
        ]
        response = self.client.responses.create(model=MODEL, input=messages,
                                                max_output_tokens=4)
        items = list(self.client.responses.input_items.list(response.id, order="asc"))
        self.assertEqual([(i.type, i.role) for i in items],
                         [("message", m["role"]) for m in messages])
        self.assertEqual([i.content[0].text for i in items], [m["content"] for m in messages])
        self.assertEqual(len({i.id for i in items}), len(items))
        newest = self.client.responses.input_items.list(response.id, limit=2)
        self.assertEqual([i.id for i in newest.data], [i.id for i in reversed(items)][:2])
        self.assertTrue(newest.has_more)
        rest = self.client.responses.input_items.list(response.id, limit=2,
                                                      after=newest.data[-1].id)
        self.assertEqual([i.id for i in rest.data], [i.id for i in reversed(items)][2:])
        with self.assertRaises(openai.NotFoundError):
            self.other.responses.input_items.list(response.id)


    # ---- webhooks (issue 25) ----

    RESPONSE_EVENTS = ["response.completed", "response.failed", "response.cancelled"]

    def test_30_webhook_endpoints(self):
        """client.webhooks.create / retrieve / list / update / test / rotate_secret / delete
        (admin): the secret at creation and rotation only; a test delivery and a background
        response's response.completed verify with OpenAI(webhook_secret=…).webhooks.unwrap; a
        synchronous response fires nothing; after a rotation only the new secret verifies;
        another client's token is refused."""
        receiver = Receiver()
        admin = sdk(ADMIN_TOKEN)
        try:
            with self.assertRaises(openai.PermissionDeniedError):
                self.client.webhooks.create(name="x", url=receiver.url,
                                            event_types=["response.completed"])
            created = admin.webhooks.create(name="hooks", url=receiver.url,
                                            event_types=self.RESPONSE_EVENTS)
            self.assertTrue(created.id.startswith("we_"), created.id)
            self.assertTrue(created.signing_secret.startswith("whsec_"))
            self.assertEqual(created.event_types, self.RESPONSE_EVENTS)
            fetched = admin.webhooks.retrieve(created.id)
            self.assertEqual((fetched.name, fetched.url), ("hooks", receiver.url))
            self.assertNotIn("signing_secret", fetched.to_dict())
            self.assertIn(created.id, [e.id for e in admin.webhooks.list()])
            renamed = admin.webhooks.update(created.id, name="renamed")
            self.assertEqual(renamed.name, "renamed")
            with self.assertRaises(openai.BadRequestError) as caught:
                admin.webhooks.update(created.id, url="ftp://example.com/")
            self.assertEqual(caught.exception.param, "url")

            tested = admin.webhooks.test(created.id, event_type="response.completed")
            self.assertEqual((tested.status_code, tested.success), (200, True))
            event = receiver.wait_event(created.signing_secret,
                                        lambda e: e.id.startswith("evt_test"))
            self.assertEqual(event.type, "response.completed")

            sync = self.client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=4)
            background = self.client.responses.create(
                model=MODEL, input=PROMPT, max_output_tokens=4, background=True)
            event = receiver.wait_event(created.signing_secret,
                                        lambda e: e.data.id == background.id)
            self.assertEqual(event.type, "response.completed")
            self.assertTrue(event.id.startswith("evt_"), event.id)
            self.assertGreater(event.created_at, 0)
            self.assertNotIn(sync.id, [e.data.id for e in receiver.events(created.signing_secret)])
            headers, _ = [d for d in receiver.received() if b'"' + background.id.encode() in d[1]][0]
            self.assertEqual(headers["webhook-id"], event.id)

            deliveries = admin.get(f"/webhook_endpoints/{created.id}/deliveries",
                                   cast_to=object)
            delivered = [d for d in deliveries["data"] if d["event_id"] == event.id]
            self.assertEqual(delivered[0]["status"], "delivered", deliveries)
            self.assertEqual(delivered[0]["attempts"], 1)

            rotated = admin.webhooks.rotate_secret(created.id)
            self.assertNotEqual(rotated.signing_secret, created.signing_secret)
            again = self.client.responses.create(
                model=MODEL, input=PROMPT, max_output_tokens=4, background=True)
            receiver.wait_event(rotated.signing_secret, lambda e: e.data.id == again.id)
            last_headers, last_body = [d for d in receiver.received()
                                       if again.id.encode() in d[1]][0]
            with self.assertRaises(openai.InvalidWebhookSignatureError):
                OpenAI(api_key="x", base_url=BASE_URL,
                       webhook_secret=created.signing_secret).webhooks.unwrap(last_body,
                                                                              last_headers)
            deleted = admin.webhooks.delete(created.id)
            self.assertTrue(deleted.deleted)
            with self.assertRaises(openai.NotFoundError):
                admin.webhooks.retrieve(created.id)
        finally:
            receiver.close()
            admin.close()

    def test_31_webhook_retries_keep_one_id(self):
        """A receiver that answers 500 three times and then 200 gets the event four times, each
        with the same webhook-id; a hanging receiver (another endpoint) holds up neither the
        tasks nor the first endpoint's deliveries."""
        failing = Receiver(answers=[500, 500, 500])
        hanging = Receiver(answers=[None] * 10, hang=20.0)
        admin = sdk(ADMIN_TOKEN)
        endpoints = []
        try:
            for name, receiver in (("failing", failing), ("hanging", hanging)):
                endpoints.append(admin.webhooks.create(
                    name=name, url=receiver.url, event_types=["response.completed"]))
            secret = endpoints[0].signing_secret
            first = self.client.responses.create(
                model=MODEL, input=PROMPT, max_output_tokens=4, background=True)
            wait_for("four attempts", lambda: len(
                [e for e in failing.events(secret) if e.data.id == first.id]) == 4)
            event = failing.wait_event(secret, lambda e: e.data.id == first.id)
            ids = [h["webhook-id"] for h, body in failing.received() if first.id.encode() in body]
            self.assertEqual(len(ids), 4, ids)
            self.assertEqual(set(ids), {event.id})
            # The hanging endpoint has the same event in flight; later work still completes
            # and is delivered to the first endpoint.
            more = [self.client.responses.create(model=MODEL, input=PROMPT, max_output_tokens=4,
                                                 background=True) for _ in range(3)]
            for response in more:
                failing.wait_event(secret, lambda e, r=response: e.data.id == r.id)
                self.assertEqual(self.client.responses.retrieve(response.id).status, "completed")
        finally:
            for endpoint in endpoints:
                admin.webhooks.delete(endpoint.id)
            failing.close()
            hanging.close()
            admin.close()

    def test_32_webhook_survives_kill_9(self):
        """A delivery whose receiver failed when its response completed, then a kill -9 and a
        restart of the server: the event is delivered after the restart, with its id."""
        receiver = Receiver(answers=[503] * 3)
        admin = sdk(ADMIN_TOKEN)
        try:
            endpoint = admin.webhooks.create(name="restart", url=receiver.url,
                                             event_types=["response.completed", "batch.completed"])
            response = self.client.responses.create(
                model=MODEL, input=PROMPT, max_output_tokens=4, background=True)
            wait_for("a first failed attempt",
                     lambda: any(response.id.encode() in b for _, b in receiver.received()))
            restarted = os.path.join(CONTROL_DIR, "restarted")
            with open(os.path.join(CONTROL_DIR, "restart"), "w", encoding="utf-8"):
                pass
            wait_for("the server to restart", lambda: os.path.exists(restarted))
            os.remove(restarted)
            event = receiver.wait_event(endpoint.signing_secret,
                                        lambda e: e.data.id == response.id, deadline=60.0)
            self.assertEqual(event.type, "response.completed")
            batch_file = self.client.files.create(
                file=("one.jsonl", jsonl([{"custom_id": "a", "method": "POST",
                                           "url": "/v1/responses",
                                           "body": {"model": MODEL, "input": PROMPT,
                                                    "max_output_tokens": 2}}])),
                purpose="batch")
            batch = self.client.batches.create(input_file_id=batch_file.id,
                                               endpoint="/v1/responses", completion_window="24h")
            event = receiver.wait_event(endpoint.signing_secret,
                                        lambda e: e.data.id == batch.id, deadline=60.0)
            self.assertEqual(event.type, "batch.completed")
            admin.webhooks.delete(endpoint.id)
        finally:
            receiver.close()
            admin.close()


def main():
    missing = [name for name in ENV if not os.environ.get(name)]
    if missing:
        names = ", ".join(missing)
        print(f"test_openai_sdk.py: set {names} (see the module's docstring)", file=sys.stderr)
        return 2
    print(f"openai {openai.__version__} against {BASE_URL}", flush=True)
    program = unittest.main(argv=[sys.argv[0], "-v", *sys.argv[1:]], exit=False)
    result = program.result
    bad = len(result.failures) + len(result.errors)
    print(f"openai SDK checks: {result.testsRun} run, {bad} not passed", flush=True)
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
