// Drives a running baton server with the official openai npm client, so that
// compatibility is judged by the SDK users actually run rather than by our own
// reading of the API reference.
//
//   node client.mjs BASE_URL MODEL      e.g. node client.mjs http://127.0.0.1:8000 stories260K
//
// BATON_API_KEY, when set, is sent as the bearer key (the server reads the
// same variable for --api-key). Exits non-zero if any check fails.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
if (!baseURL || !model) {
  console.error('usage: node client.mjs BASE_URL MODEL');
  process.exit(2);
}

const client = new OpenAI({
  baseURL: baseURL.replace(/\/+$/, '') + '/v1',
  apiKey: process.env.BATON_API_KEY || 'none',
  // Retries would turn a wrong status into a slow pass or a confusing failure.
  maxRetries: 0,
  timeout: 30_000,
});

// A hung server must fail the run, not stall CI until its global timeout.
setTimeout(() => {
  console.error('FAIL: timed out after 120 s');
  process.exit(1);
}, 120_000).unref();

const PROMPT = 'Once upon a time';
const MAX_TOKENS = 16;
const FINISH = ['stop', 'length'];

// The greedy non-streaming answers are the reference the streaming checks
// compare against, so they are computed once and shared.
const once = (f) => {
  let p;
  return () => (p ??= f());
};
const chatReference = once(() =>
  client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: PROMPT }],
    max_tokens: MAX_TOKENS,
    temperature: 0,
  }),
);
const completionReference = once(() =>
  client.completions.create({ model, prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0 }),
);

function checkUsage(usage, what) {
  assert.ok(usage, `${what}: usage missing`);
  assert.ok(
    Number.isInteger(usage.completion_tokens) && usage.completion_tokens >= 1 && usage.completion_tokens <= MAX_TOKENS,
    `${what}: usage.completion_tokens = ${usage.completion_tokens}, want 1..${MAX_TOKENS}`,
  );
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens >= 1, `${what}: usage.prompt_tokens = ${usage.prompt_tokens}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, `${what}: total_tokens`);
  const cached = usage.prompt_tokens_details?.cached_tokens;
  assert.ok(
    Number.isInteger(cached) && cached >= 0 && cached < usage.prompt_tokens,
    `${what}: usage.prompt_tokens_details.cached_tokens = ${cached}, want 0..prompt_tokens-1`,
  );
}

// tokenCounts is usage without the prefix cache's share: a second request
// for the same prompt reads the first one's pages, so cached_tokens differ.
function tokenCounts(usage) {
  const { prompt_tokens_details: _, ...counts } = usage;
  return counts;
}

// expectAPIError runs f and checks it throws the SDK's error class for status.
async function expectAPIError(f, cls, status) {
  let err;
  try {
    await f();
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected ${cls.name}, but the request succeeded`);
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${err?.constructor?.name}: ${err?.message}`);
  assert.equal(err.status, status);
  return err;
}

const checks = [
  ['chat non-streaming', async () => {
    const r = await chatReference();
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    const c = r.choices[0];
    assert.equal(c.message.role, 'assistant');
    assert.equal(typeof c.message.content, 'string');
    assert.ok(c.message.content.length > 0, 'message.content is empty');
    assert.ok(FINISH.includes(c.finish_reason), `finish_reason = ${c.finish_reason}`);
    checkUsage(r.usage, 'chat');
  }],

  ['chat streaming with usage', async () => {
    const ref = await chatReference();
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: PROMPT }],
      max_tokens: MAX_TOKENS,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let last;
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      last = chunk;
      assert.equal(chunk.object, 'chat.completion.chunk');
      const c = chunk.choices[0];
      if (c) {
        text += c.delta?.content ?? '';
        if (c.finish_reason != null) {
          assert.equal(finish, null, 'finish_reason sent twice');
          finish = c.finish_reason;
        }
      }
    }
    assert.ok(chunks >= 2, `only ${chunks} chunk(s)`);
    assert.equal(text, ref.choices[0].message.content, 'streamed text differs from the non-streaming answer');
    assert.equal(finish, ref.choices[0].finish_reason, 'streamed finish_reason differs');
    assert.deepEqual(last.choices, [], 'usage chunk must have empty choices');
    checkUsage(last.usage, 'chat stream');
    assert.deepEqual(tokenCounts(last.usage), tokenCounts(ref.usage), 'streamed usage differs from the non-streaming usage');
    assert.ok(last.usage.prompt_tokens_details.cached_tokens > 0, 'the same prompt again read nothing from the prefix cache');
  }],

  ['completions, plain and streamed', async () => {
    const r = await completionReference();
    assert.equal(r.object, 'text_completion');
    const c = r.choices[0];
    assert.equal(typeof c.text, 'string');
    assert.ok(c.text.length > 0, 'text is empty');
    assert.ok(FINISH.includes(c.finish_reason), `finish_reason = ${c.finish_reason}`);
    checkUsage(r.usage, 'completions');

    const stream = await client.completions.create({
      model,
      prompt: PROMPT,
      max_tokens: MAX_TOKENS,
      temperature: 0,
      stream: true,
    });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (!ch) continue;
      text += ch.text ?? '';
      finish = ch.finish_reason ?? finish;
    }
    assert.equal(text, c.text, 'streamed text differs from the non-streaming answer');
    assert.equal(finish, c.finish_reason, 'streamed finish_reason differs');
  }],

  ['n, echo and logit_bias', async () => {
    const ref = await chatReference();
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: PROMPT }],
      max_tokens: MAX_TOKENS,
      temperature: 0,
      n: 2,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1], 'n=2: choice indexes');
    for (const c of r.choices) assert.equal(c.message.content, ref.choices[0].message.content, 'greedy choices differ from n=1');
    assert.equal(r.usage.completion_tokens, 2 * ref.usage.completion_tokens, 'n=2: completion tokens are not summed');

    const plain = (await completionReference()).choices[0].text;
    const echoed = await client.completions.create({ model, prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, echo: true });
    assert.equal(echoed.choices[0].text, PROMPT + plain, 'echo');

    // The first generated token, banned, cannot start the answer.
    const headers = { 'Content-Type': 'application/json' };
    if (process.env.BATON_API_KEY) headers.Authorization = 'Bearer ' + process.env.BATON_API_KEY;
    const res = await fetch(baseURL.replace(/\/+$/, '') + '/tokenize', {
      method: 'POST',
      headers,
      body: JSON.stringify({ model, prompt: PROMPT + plain }),
    });
    assert.equal(res.status, 200, '/tokenize status');
    const { tokens, count } = await res.json();
    assert.equal(count, tokens.length, '/tokenize count');
    const prompt = await (await fetch(baseURL.replace(/\/+$/, '') + '/tokenize', {
      method: 'POST',
      headers,
      body: JSON.stringify({ model, prompt: PROMPT }),
    })).json();
    const first = tokens[prompt.count];
    const biased = await client.completions.create({
      model, prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 0, logit_bias: { [first]: -100 },
    });
    assert.notEqual(biased.choices[0].text, plain, `logit_bias -100 on token ${first} changed nothing`);
  }],

  ['models.list', async () => {
    const ids = [];
    for await (const m of client.models.list()) {
      assert.equal(m.object, 'model');
      ids.push(m.id);
    }
    assert.ok(ids.includes(model), `models.list() = ${JSON.stringify(ids)}, missing ${model}`);
  }],

  ['unknown model is 404', async () => {
    const err = await expectAPIError(
      () => client.chat.completions.create({
        model: 'no-such-model-' + process.pid,
        messages: [{ role: 'user', content: PROMPT }],
        max_tokens: 1,
      }),
      OpenAI.NotFoundError,
      404,
    );
    assert.ok(err.error?.message, 'error.message is empty');
  }],

  ['max_tokens 0 is 400', async () => {
    const err = await expectAPIError(
      () => client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: PROMPT }],
        max_tokens: 0,
      }),
      OpenAI.BadRequestError,
      400,
    );
    assert.equal(typeof err.error?.message, 'string');
    assert.ok(err.error.message.length > 0, 'error.message is empty');
    assert.equal(err.error.param, 'max_tokens');
  }],
];

let passed = 0;
let failed = 0;
for (const [name, check] of checks) {
  const t0 = performance.now();
  try {
    await check();
    passed++;
    console.log(`ok   ${name} (${Math.round(performance.now() - t0)} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e?.message ?? e}`);
    // A stack helps only for a bug in this script, not for a failed check or
    // an error status the server sent.
    if (e?.stack && !(e instanceof assert.AssertionError) && !(e instanceof OpenAI.APIError)) console.log(e.stack);
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
