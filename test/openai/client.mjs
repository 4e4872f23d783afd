// Drives a running baton server with the official openai npm client, so that
// compatibility is judged by the SDK users actually run rather than by our own
// reading of the API reference.
//
//   node client.mjs BASE_URL MODEL      e.g. node client.mjs http://127.0.0.1:8000 stories260K
//
// The server must run with --tool-call-parser hermes (the tool checks).
//
// BATON_API_KEY, when set, is sent as the bearer key (the server reads the
// same variable for --api-key). Exits non-zero if any check fails.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

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

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
      required: ['city', 'days'],
      additionalProperties: false,
    },
  },
};

function checkWeatherArgs(text) {
  const a = JSON.parse(text);
  assert.deepEqual(Object.keys(a).sort(), ['city', 'days'], `arguments ${text}`);
  assert.ok(['Paris', 'Rome', 'Oslo'].includes(a.city), `city in ${text}`);
  assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7, `days in ${text}`);
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

  // EXPECT_SPEC_USAGE=1: the server speculates, and usage carries its
  // figures (SGLang's meta_info names) through the SDK, whole and streamed;
  // otherwise there are none.
  ['usage: speculation figures', async () => {
    const prompt = `${PROMPT} there was a cat. ${PROMPT} there was a cat. ${PROMPT} there was a cat. ${PROMPT}`;
    const r = await client.completions.create({ model, prompt, max_tokens: 60, temperature: 0 });
    const stream = await client.completions.create({
      model, prompt, max_tokens: 60, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let streamed = null;
    for await (const chunk of stream) streamed = chunk.usage ?? streamed;
    for (const [what, u] of [['whole', r.usage], ['streamed', streamed]]) {
      assert.ok(u && u.completion_tokens === 60 && u.total_tokens === u.prompt_tokens + 60, `${what}: usage ${JSON.stringify(u)}`);
      const fields = ['spec_verify_ct', 'spec_draft_token_num', 'spec_accept_token_num', 'spec_accept_length', 'spec_accept_rate'];
      if (process.env.EXPECT_SPEC_USAGE !== '1') {
        for (const f of fields) assert.equal(u[f], undefined, `${what}: ${f} from a server that does not speculate`);
        continue;
      }
      for (const f of fields) assert.equal(typeof u[f], 'number', `${what}: usage.${f} = ${u[f]}`);
      assert.ok(u.spec_verify_ct >= 1 && u.spec_verify_ct <= u.completion_tokens, `${what}: spec_verify_ct ${u.spec_verify_ct}`);
      assert.ok(u.spec_draft_token_num >= 1 && u.spec_accept_token_num <= u.spec_draft_token_num, `${what}: ${JSON.stringify(u)}`);
    }
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
  ['chat.completions.parse with zodResponseFormat', async () => {
    const Person = z.object({ name: z.string().max(8), age: z.number().int().min(0).max(120), happy: z.boolean() });
    const r = await client.chat.completions.parse({
      model,
      messages: [{ role: 'user', content: 'Tell me about Lily' }],
      response_format: zodResponseFormat(Person, 'person'),
      max_tokens: 200, temperature: 0.8, seed: 7,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop', `finish_reason ${r.choices[0].finish_reason}, content ${m.content}`);
    assert.ok(m.parsed, `no parsed object from ${m.content}`);
    Person.parse(m.parsed);
    console.log(`     parsed: ${JSON.stringify(m.parsed)}`);
  }],

  ['tools: tool_choice required', async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [WEATHER], tool_choice: 'required', parallel_tool_calls: false, max_tokens: 120, temperature: 0.7, seed: 3,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', `finish_reason ${c.finish_reason}: ${JSON.stringify(c.message)}`);
    assert.ok(c.message.tool_calls?.length >= 1, 'no tool_calls');
    for (const call of c.message.tool_calls) {
      assert.equal(call.type, 'function');
      assert.ok(call.id, 'tool call without id');
      assert.equal(call.function.name, 'get_weather');
      checkWeatherArgs(call.function.arguments);
    }
    console.log(`     tool_calls: ${JSON.stringify(c.message.tool_calls.map((t) => t.function))}`);
  }],

  ['tools: streamed named call reassembles', async () => {
    const stream = client.chat.completions.stream({
      model, messages: [{ role: 'user', content: 'What is the weather in Rome?' }],
      tools: [WEATHER, { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 120, temperature: 0.7, seed: 5,
    });
    let args = '';
    let chunks = 0;
    stream.on('chunk', (ch) => {
      for (const tc of ch.choices[0]?.delta?.tool_calls ?? []) {
        args += tc.function?.arguments ?? '';
        chunks++;
      }
    });
    const final = await stream.finalChatCompletion();
    const calls = final.choices[0].message.tool_calls;
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(calls?.length, 1, `want one call, got ${JSON.stringify(calls)}`);
    assert.equal(calls[0].function.name, 'get_weather');
    assert.equal(calls[0].function.arguments, args, 'deltas do not add up to the final arguments');
    assert.ok(chunks > 1, 'the arguments came in one chunk');
    checkWeatherArgs(args);
  }],

  ['tools: none gives content only', async () => {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: PROMPT }], tools: [WEATHER], tool_choice: 'none',
      max_tokens: MAX_TOKENS, temperature: 0,
    });
    assert.ok(!r.choices[0].message.tool_calls?.length, 'tool_calls despite tool_choice none');
    assert.equal(typeof r.choices[0].message.content, 'string');
  }],

  ['responses.create', async () => {
    const r = await client.responses.create({ model, input: PROMPT, max_output_tokens: MAX_TOKENS, temperature: 0 });
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status), `status ${r.status}`);
    assert.ok(r.output_text.length > 0, 'empty output_text');
    // The same conversation as a chat completion gives the same greedy text.
    const ref = await chatReference();
    assert.equal(r.output_text, ref.choices[0].message.content);
    assert.ok(r.usage.output_tokens >= 1 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, 'usage');
    console.log(`     output_text: ${JSON.stringify(r.output_text)}`);
  }],

  ['responses.stream', async () => {
    const stream = client.responses.stream({ model, input: [{ role: 'user', content: PROMPT }], max_output_tokens: MAX_TOKENS, temperature: 0 });
    let deltas = '';
    const types = [];
    stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
    stream.on('event', (e) => types.push(e.type));
    const final = await stream.finalResponse();
    const ref = await chatReference();
    assert.equal(types[0], 'response.created');
    assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), `last event ${types.at(-1)}`);
    assert.equal(deltas, ref.choices[0].message.content);
    const text = final.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');
    assert.equal(text, deltas, 'the final response differs from its deltas');
  }],

  ['responses function call', async () => {
    const r = await client.responses.create({
      model, input: 'What is the weather in Paris?', instructions: 'Use the tools.',
      tools: [{ type: 'function', name: 'get_weather', parameters: WEATHER.function.parameters, strict: true }],
      tool_choice: 'required', parallel_tool_calls: false, max_output_tokens: 120, temperature: 0.7, seed: 9,
    });
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.ok(calls.length >= 1, `no function_call in ${JSON.stringify(r.output)}`);
    for (const c of calls) {
      assert.equal(c.name, 'get_weather');
      assert.ok(c.call_id, 'function_call without call_id');
      checkWeatherArgs(c.arguments);
    }
    console.log(`     function_call: ${calls[0].name}(${calls[0].arguments})`);
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
