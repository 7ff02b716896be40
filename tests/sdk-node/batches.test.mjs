// The official OpenAI Node SDK (npm `openai`, pinned in package-lock.json) against a running
// LMSP service: Responses, then OpenAI's Files + Batch API (issue 24: upload, create, retrieve,
// download) for /v1/responses and /v1/chat/completions, and the batch errors an application
// meets (cancel of a finished batch, an unknown input file).
//
// Run by tests/openai_node.rs (`node --test tests/sdk-node/batches.test.mjs`), which starts
// `lmsp serve`, pairs an application client and sets:
//   LMSP_BASE_URL  the service's base URL, with /v1
//   LMSP_TOKEN     that client's token (responses:write, responses:read, models:read)
// Only node's own `node:test` and `node:assert`; install the SDK with scripts/openai-node-deps.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI, { APIError, NotFoundError, toFile } from 'openai';

const MODEL = 'reference';
const PROMPT = 'Once upon a time';
/** How long a batch may take to end (the reference engine runs each line in well under 1 s). */
const BATCH_DEADLINE_MS = 60_000;

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

/** The JSONL of an input file: one request per line for `url`. */
function jsonl(url, bodies) {
  return Object.entries(bodies)
    .map(([custom_id, body]) => JSON.stringify({ custom_id, method: 'POST', url, body }))
    .join('\n')
    .concat('\n');
}

/** What the SDK's `output_text` is (ResponsesParser's addOutputText), for a raw response body. */
function outputText(body) {
  return body.output
    .filter((item) => item.type === 'message')
    .flatMap((item) => item.content)
    .filter((part) => part.type === 'output_text')
    .map((part) => part.text)
    .join('');
}

/** Polls `batches.retrieve` until the batch has ended, for at most BATCH_DEADLINE_MS. */
async function waitEnded(batchId) {
  const ended = ['completed', 'failed', 'expired', 'cancelled'];
  const deadline = Date.now() + BATCH_DEADLINE_MS;
  for (;;) {
    const batch = await client.batches.retrieve(batchId);
    if (ended.includes(batch.status)) return batch;
    assert.ok(
      Date.now() < deadline,
      `batch ${batchId} still ${batch.status} after ${BATCH_DEADLINE_MS} ms: ` +
        JSON.stringify(batch),
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * Uploads the lines of `bodies` for `endpoint` (`files.create` with `toFile`: the SDK sends the
 * `file` part before `purpose`), creates a batch from them, waits for it to complete, and
 * returns the batch, its input file and the output file's lines (parsed), checking what every
 * completed batch must be: each custom_id once, each line a 200.
 */
async function runBatch(endpoint, bodies, filename) {
  const data = jsonl(endpoint, bodies);
  const file = await client.files.create({
    file: await toFile(Buffer.from(data), filename),
    purpose: 'batch',
  });
  assert.match(file.id, /^file-/);
  assert.equal(file.object, 'file');
  assert.equal(file.purpose, 'batch');
  assert.equal(file.filename, filename);
  assert.equal(file.bytes, Buffer.byteLength(data));

  const batch = await client.batches.create({
    input_file_id: file.id,
    endpoint,
    completion_window: '24h',
  });
  assert.match(batch.id, /^batch_/);
  assert.equal(batch.object, 'batch');
  assert.equal(batch.endpoint, endpoint);
  assert.equal(batch.input_file_id, file.id);

  const done = await waitEnded(batch.id);
  const total = Object.keys(bodies).length;
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.deepEqual(
    [done.request_counts.total, done.request_counts.completed, done.request_counts.failed],
    [total, total, 0],
  );
  assert.ok(done.output_file_id, 'a completed batch has an output file');
  assert.equal(done.error_file_id ?? null, null, 'no line failed, so no error file');

  // files.content answers a fetch Response: the file's bytes, as text here.
  const content = await client.files.content(done.output_file_id);
  const text = await content.text();
  const lines = text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line));
  assert.deepEqual(
    lines.map((line) => line.custom_id).sort(),
    Object.keys(bodies).sort(),
    'each custom_id exactly once',
  );
  for (const line of lines) {
    assert.match(line.id, /^batch_req_/);
    assert.equal(line.error ?? null, null, JSON.stringify(line));
    assert.equal(line.response.status_code, 200, JSON.stringify(line));
  }
  return { batch: done, file, lines };
}

test('responses.create answers plain text', async () => {
  const response = await client.responses.create({
    model: MODEL,
    input: PROMPT,
    max_output_tokens: 8,
  });
  assert.match(response.id, /^resp_/);
  assert.equal(response.status, 'completed');
  assert.equal(typeof response.output_text, 'string');
  assert.ok(response.output_text.length > 0, 'some text');
  assert.equal(response.output_text, outputText(response));
  assert.equal(response.usage.output_tokens, 8);
});

test('a batch of /v1/responses: each line is the synchronous answer', async () => {
  // `seed` is LMSP's own field: the SDK sends the params object as the JSON body as it is, so
  // an extra key goes through (TypeScript needs a cast, e.g. `as ResponseCreateParams`).
  const bodies = Object.fromEntries(
    [0, 1, 2, 3, 4].map((i) => [
      `resp-${i}`,
      { model: MODEL, input: `${PROMPT} ${i}`, max_output_tokens: 8, seed: 1000 + i },
    ]),
  );
  const { lines } = await runBatch('/v1/responses', bodies, 'requests.jsonl');
  for (const line of lines) {
    const body = line.response.body;
    assert.equal(body.object, 'response');
    assert.equal(body.status, 'completed');
    const sync = await client.responses.create(bodies[line.custom_id]);
    // `output_text` is the SDK's (added to what `responses.create` returns): a raw body need
    // not carry it, so it is derived the same way; where the body has one, it must agree.
    const batched = body.output_text ?? outputText(body);
    assert.equal(outputText(body), batched);
    assert.equal(batched, sync.output_text, `${line.custom_id}: batch and sync differ`);
    assert.equal(body.usage.output_tokens, sync.usage.output_tokens);
  }
});

test('a batch of /v1/chat/completions: each line is the synchronous answer', async () => {
  const bodies = Object.fromEntries(
    [0, 1, 2].map((i) => [
      `chat-${i}`,
      {
        model: MODEL,
        messages: [{ role: 'user', content: `Hi ${i}` }],
        max_completion_tokens: 6,
        seed: 2000 + i,
      },
    ]),
  );
  const { lines } = await runBatch('/v1/chat/completions', bodies, 'chat.jsonl');
  for (const line of lines) {
    const body = line.response.body;
    assert.equal(body.object, 'chat.completion');
    const sync = await client.chat.completions.create(bodies[line.custom_id]);
    assert.equal(
      body.choices[0].message.content,
      sync.choices[0].message.content,
      `${line.custom_id}: batch and sync differ`,
    );
  }
});

test('batches.list, files.retrieve, cancel of a finished batch, an unknown file', async () => {
  const bodies = { 'one-0': { model: MODEL, input: PROMPT, max_output_tokens: 4, seed: 7 } };
  const { batch, file } = await runBatch('/v1/responses', bodies, 'one.jsonl');

  // batches.list pages through the caller's batches (newest first).
  const listed = [];
  for await (const each of client.batches.list({ limit: 100 })) listed.push(each.id);
  assert.ok(listed.includes(batch.id), `${batch.id} not in ${JSON.stringify(listed)}`);

  const retrieved = await client.files.retrieve(file.id);
  assert.deepEqual(
    [retrieved.id, retrieved.purpose, retrieved.filename, retrieved.bytes],
    [file.id, 'batch', 'one.jsonl', file.bytes],
  );
  const output = await client.files.retrieve(batch.output_file_id);
  assert.equal(output.purpose, 'batch_output');

  // A completed batch cannot be cancelled: 409 batch_not_cancellable. (No retries: the SDK
  // retries a 409 by default, which would only ask again.)
  await assert.rejects(client.batches.cancel(batch.id, { maxRetries: 0 }), (error) => {
    assert.ok(error instanceof APIError, `an APIError, not ${error}`);
    assert.equal(error.status, 409);
    assert.equal(error.code, 'batch_not_cancellable');
    return true;
  });
  assert.equal((await client.batches.retrieve(batch.id)).status, 'completed');

  // A batch of a file that does not exist: NotFoundError, and no batch.
  await assert.rejects(
    client.batches.create({
      input_file_id: 'file-01J00000000000000000000000',
      endpoint: '/v1/responses',
      completion_window: '24h',
    }),
    (error) => {
      assert.ok(error instanceof NotFoundError, `a NotFoundError, not ${error}`);
      assert.equal(error.status, 404);
      return true;
    },
  );
});
