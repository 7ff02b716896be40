// The official OpenAI Node SDK (npm `openai`, pinned in package-lock.json) verifying the
// service's webhooks (issue 25): a receiver on 127.0.0.1 keeps every delivery's raw body and
// headers; an admin registers it for `response.completed`; a background response's end is
// delivered, and the SDK's `client.webhooks.unwrap(body, headers, secret)` verifies and parses it
// (a wrong secret throws InvalidWebhookSignatureError); the endpoint's test delivery verifies
// too; the endpoint is deleted.
//
// openai-node 5.23.2 has no webhook endpoint methods (only `unwrap` / `verifySignature`), so the
// endpoint API is called through the client's own `post` / `delete`, which add the base URL, the
// token and the SDK's error classes.
//
// Run by tests/openai_node.rs (`node --test … webhooks.test.mjs`), which starts `lmsp serve`,
// pairs an application client and sets:
//   LMSP_BASE_URL     the service's base URL, with /v1
//   LMSP_TOKEN        that client's token (responses:write, responses:read, models:read)
//   LMSP_ADMIN_TOKEN  the admin token: the webhook endpoint API is admin only
// Only node's own `node:test`, `node:assert`, `node:http` and `node:crypto`.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import { after, before, test } from 'node:test';

import OpenAI, { InvalidWebhookSignatureError, NotFoundError, PermissionDeniedError } from 'openai';

const MODEL = 'reference';
const PROMPT = 'Once upon a time';
/** How long a delivery may take to arrive (the deliverer polls every 200 ms). */
const DELIVERY_DEADLINE_MS = 30_000;

function required(name) {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: run this through tests/openai_node.rs`);
  return value;
}

const baseURL = required('LMSP_BASE_URL');
const client = new OpenAI({ baseURL, apiKey: required('LMSP_TOKEN'), timeout: 30_000 });
const admin = new OpenAI({ baseURL, apiKey: required('LMSP_ADMIN_TOKEN'), timeout: 30_000 });

/**
 * A webhook receiver: a real HTTP server on 127.0.0.1 (a port of its own) that keeps every
 * request's raw body (the bytes that were signed, as a string) and headers (node's plain
 * record, lower-case names), and answers 200.
 */
function startReceiver() {
  const deliveries = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      deliveries.push({
        method: req.method,
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      });
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok');
    });
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}/hooks`,
        deliveries,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections?.();
            server.close(() => done());
          }),
      });
    });
  });
}

/**
 * Polls the receiver (every 50 ms, for at most DELIVERY_DEADLINE_MS) until a delivery whose raw
 * body, parsed, satisfies `wanted`; returns that delivery.
 */
async function waitDelivery(receiver, what, wanted) {
  const deadline = Date.now() + DELIVERY_DEADLINE_MS;
  for (;;) {
    const found = receiver.deliveries.find((d) => {
      try {
        return wanted(JSON.parse(d.body));
      } catch {
        return false;
      }
    });
    if (found) return found;
    assert.ok(
      Date.now() < deadline,
      `no delivery of ${what} within ${DELIVERY_DEADLINE_MS} ms; received: ` +
        JSON.stringify(receiver.deliveries),
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A secret of the right shape (`whsec_` + base64 of 32 random bytes) that signed nothing. */
function otherSecret() {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

let receiver;
let endpoint;

before(async () => {
  receiver = await startReceiver();
});

after(async () => {
  // Whatever failed, the endpoint goes (so nothing is retried at a closed port) and so does the
  // receiver (an open server would keep node running).
  if (endpoint) {
    await admin.delete(`/webhook_endpoints/${endpoint.id}`).catch(() => {});
  }
  await receiver?.close();
});

test('only the admin registers a webhook endpoint', async () => {
  await assert.rejects(
    client.post('/webhook_endpoints', {
      body: { name: 'not mine', url: receiver.url, event_types: ['response.completed'] },
    }),
    PermissionDeniedError,
  );
});

test("a background response's response.completed is delivered and verifies with unwrap", async () => {
  endpoint = await admin.post('/webhook_endpoints', {
    body: { name: 'openai-node receiver', url: receiver.url, event_types: ['response.completed'] },
  });
  assert.match(endpoint.id, /^we_/);
  assert.equal(endpoint.object, 'webhook_endpoint');
  assert.equal(endpoint.url, receiver.url);
  assert.deepEqual(endpoint.event_types, ['response.completed']);
  assert.match(endpoint.signing_secret, /^whsec_/);
  const secret = endpoint.signing_secret;

  const response = await client.responses.create({
    model: MODEL,
    input: PROMPT,
    max_output_tokens: 4,
    background: true,
  });
  assert.match(response.id, /^resp_/);
  assert.equal(response.background, true);

  const delivery = await waitDelivery(
    receiver,
    `response.completed of ${response.id}`,
    (event) => event.data?.id === response.id,
  );
  assert.equal(delivery.method, 'POST');
  assert.match(delivery.headers['webhook-signature'], /^v1,/);
  assert.match(delivery.headers['webhook-timestamp'], /^\d+$/);

  // unwrap(payload: string, headers: HeadersLike, secret?, tolerance = 300): async; node's
  // plain header record is a HeadersLike.
  const event = await client.webhooks.unwrap(delivery.body, delivery.headers, secret);
  assert.equal(event.object, 'event');
  assert.equal(event.type, 'response.completed');
  assert.equal(event.data.id, response.id);
  assert.match(event.id, /^evt_/);
  assert.ok(event.created_at > 0, `created_at: ${event.created_at}`);
  assert.equal(delivery.headers['webhook-id'], event.id);

  // Its task has ended: the response is completed.
  const retrieved = await client.responses.retrieve(response.id);
  assert.equal(retrieved.status, 'completed');

  // Another secret, a changed body or a changed id does not verify.
  await assert.rejects(
    client.webhooks.unwrap(delivery.body, delivery.headers, otherSecret()),
    InvalidWebhookSignatureError,
  );
  await assert.rejects(
    client.webhooks.unwrap(delivery.body.replace(response.id, 'resp_other'), delivery.headers, secret),
    InvalidWebhookSignatureError,
  );
  await assert.rejects(
    client.webhooks.unwrap(
      delivery.body,
      { ...delivery.headers, 'webhook-id': 'evt_other' },
      secret,
    ),
    InvalidWebhookSignatureError,
  );
});

test('the test delivery of batch.completed verifies; then the endpoint is deleted', async () => {
  assert.ok(endpoint, 'the endpoint the previous test registers');
  const secret = endpoint.signing_secret;

  const tested = await admin.post(`/webhook_endpoints/${endpoint.id}/test`, {
    body: { event_type: 'batch.completed' },
  });
  assert.equal(tested.object, 'webhook_endpoint.test');
  assert.equal(tested.webhook_endpoint_id, endpoint.id);
  assert.equal(tested.event_type, 'batch.completed');
  assert.equal(tested.status_code, 200);
  assert.equal(tested.success, true);

  // The test is sent before the answer: it is already here.
  const delivery = await waitDelivery(
    receiver,
    'the test batch.completed',
    (event) => event.type === 'batch.completed',
  );
  const event = await client.webhooks.unwrap(delivery.body, delivery.headers, secret);
  assert.equal(event.type, 'batch.completed');
  assert.match(event.id, /^evt_/);
  assert.match(event.data.id, /^batch_/);
  assert.equal(delivery.headers['webhook-id'], event.id);
  await assert.rejects(
    client.webhooks.unwrap(delivery.body, delivery.headers, otherSecret()),
    InvalidWebhookSignatureError,
  );

  const deleted = await admin.delete(`/webhook_endpoints/${endpoint.id}`);
  assert.deepEqual(deleted, { id: endpoint.id, object: 'webhook_endpoint.deleted', deleted: true });
  const id = endpoint.id;
  endpoint = undefined;
  await assert.rejects(admin.get(`/webhook_endpoints/${id}`), NotFoundError);
});
