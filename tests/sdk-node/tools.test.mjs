// The official OpenAI Node SDK (npm `openai`, pinned in package-lock.json) against a running
// LMSP service: a function tool's loop (call → function_call_output → answer) on Responses and
// on Chat Completions, streamed and not, and structured outputs through `responses.parse` and
// `chat.completions.parse` — what the README's JavaScript example under "Tools and structured
// outputs" does.
//
// Run by tests/openai_node.rs (`node --test … tools.test.mjs`), which starts `lmsp serve` on the
// reference engine (it calls the chosen tool with the smallest valid arguments, and answers a
// schema with its smallest valid instance: docs/tools-and-structured-outputs.md), pairs an
// application client and sets:
//   LMSP_BASE_URL  the service's base URL, with /v1
//   LMSP_TOKEN     that client's token (responses:write, responses:read, models:read)
// Only node's own `node:test` and `node:assert`; install the SDK with scripts/openai-node-deps.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const MODEL = 'reference';

function required(name) {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run this through tests/openai_node.rs`);
  return value;
}

const client = new OpenAI({
  baseURL: required('LMSP_BASE_URL'),
  apiKey: required('LMSP_TOKEN'),
  timeout: 30_000,
});

const parameters = {
  type: 'object',
  properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1 } },
  required: ['city', 'days'],
  additionalProperties: false,
};
/** The reference engine's arguments for `parameters`: its smallest valid instance. */
const SMALLEST_ARGUMENTS = { city: '', days: 1 };

const person = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 2 },
    age: { type: 'integer', minimum: 18 },
    color: { enum: ['red', 'green', 'blue'] },
  },
  required: ['name', 'age', 'color'],
  additionalProperties: false,
};
const SMALLEST_PERSON = { name: 'aa', age: 18, color: 'red' };

test('responses: a required call, its function_call_output, then a text answer; streamed too', async () => {
  const tools = [{ type: 'function', name: 'get_weather', parameters, strict: true }];
  const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.responses.create({ model: MODEL, input, tools, tool_choice: 'required' });
  assert.equal(first.status, 'completed');
  const call = first.output[0];
  assert.equal(call.type, 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.match(call.call_id, /^call_/);
  assert.deepEqual(JSON.parse(call.arguments), SMALLEST_ARGUMENTS);

  const answer = { type: 'function_call_output', call_id: call.call_id, output: '{"celsius": 21}' };
  const echoed = await client.responses.create({
    model: MODEL, input: [...input, ...first.output, answer], tools, max_output_tokens: 8,
  });
  assert.equal(echoed.output[0].type, 'message');
  assert.ok(echoed.output_text.length > 0, JSON.stringify(echoed.output));
  const chained = await client.responses.create({
    model: MODEL, previous_response_id: first.id, input: [answer], tools, max_output_tokens: 8,
  });
  assert.equal(chained.output[0].type, 'message');
  assert.ok(chained.output_text.length > 0, JSON.stringify(chained.output));

  const stream = await client.responses.create({
    model: MODEL, input, tools, tool_choice: 'required', stream: true,
  });
  const deltas = [];
  let done;
  let completed;
  for await (const event of stream) {
    if (event.type === 'response.function_call_arguments.delta') deltas.push(event.delta);
    if (event.type === 'response.function_call_arguments.done') done = event.arguments;
    if (event.type === 'response.completed') completed = event.response;
  }
  assert.equal(deltas.join(''), call.arguments);
  assert.equal(done, call.arguments);
  assert.equal(completed.output[0].arguments, call.arguments);
});

test('chat: tool_calls with finish_reason tool_calls, the tool message, then text; streamed too', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters, strict: true } }];
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await client.chat.completions.create({
    model: MODEL, messages, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  const choice = first.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), SMALLEST_ARGUMENTS);

  const follow = await client.chat.completions.create({
    model: MODEL,
    messages: [...messages, choice.message, { role: 'tool', tool_call_id: call.id, content: '21 degrees' }],
    tools,
    max_completion_tokens: 8,
  });
  assert.ok(['stop', 'length'].includes(follow.choices[0].finish_reason));
  assert.ok(follow.choices[0].message.content.length > 0);
  assert.equal(follow.choices[0].message.tool_calls, undefined);

  const stream = await client.chat.completions.create({
    model: MODEL, messages, tools, tool_choice: 'required', stream: true,
  });
  let arguments_ = '';
  let id;
  let finish;
  for await (const chunk of stream) {
    const [streamed] = chunk.choices;
    if (!streamed) continue;
    for (const piece of streamed.delta.tool_calls ?? []) {
      id ??= piece.id;
      arguments_ += piece.function?.arguments ?? '';
    }
    finish = streamed.finish_reason ?? finish;
  }
  assert.match(id, /^call_/);
  assert.equal(arguments_, call.function.arguments);
  assert.equal(finish, 'tool_calls');
});

test('structured outputs: responses.parse and chat.completions.parse give the parsed object', async () => {
  const format = { type: 'json_schema', name: 'person', schema: person, strict: true };
  const parsed = await client.responses.parse({
    model: MODEL, input: 'Describe a person', text: { format },
  });
  assert.deepEqual(parsed.output_parsed, SMALLEST_PERSON);
  assert.deepEqual(JSON.parse(parsed.output_text), SMALLEST_PERSON);

  const completion = await client.chat.completions.parse({
    model: MODEL,
    messages: [{ role: 'user', content: 'Describe a person' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } },
  });
  assert.deepEqual(completion.choices[0].message.parsed, SMALLEST_PERSON);

  // A schema keyword LMSP does not know is refused by name, never ignored.
  await assert.rejects(
    client.responses.create({
      model: MODEL,
      input: 'Describe a person',
      text: { format: { ...format, schema: { ...person, colour: 'red' } } },
    }),
    (error) => error.status === 400 && error.param === 'text.format.schema.colour',
  );
});
