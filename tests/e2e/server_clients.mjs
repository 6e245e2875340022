// Real clients against a running oasis-server (started by test_server_clients.sh):
// the official `openai` npm package (completions, chat, streaming), 32 concurrent streams
// that must match their sequential greedy outputs, client disconnects that must abort the
// engine request and free its KV cache, /metrics counters that add up to the usage the
// responses reported, and a gRPC client (@grpc/grpc-js + @grpc/proto-loader) for
// Generate / Health / ListModels, its error codes and cancellation.
// Usage: node server_clients.mjs <base url> <grpc port> <proto file> <node_modules dir>
//        [<gRPC port of a server started with --api-key s3cret>]
import { createRequire } from 'node:module';
import http from 'node:http';
import path from 'node:path';

const [baseUrl, grpcPort, protoFile, modulesDir, authGrpcPort] = process.argv.slice(2);
const require = createRequire(path.join(modulesDir, 'noop.js'));
const OpenAI = require('openai').default ?? require('openai');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

let failures = 0;
function check(cond, what, detail) {
  if (cond) {
    console.log(`ok: ${what}`);
  } else {
    failures++;
    console.log(`FAILED: ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 1500) : ''}`);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function metrics() {
  const text = await (await fetch(`${baseUrl}/metrics`)).text();
  const get = (name) => {
    const line = text.split('\n').find((l) => l.startsWith(name));
    return line === undefined ? NaN : Number(line.slice(line.lastIndexOf(' ') + 1));
  };
  return {
    running: get('oasis:num_requests_running{'),
    waiting: get('oasis:num_requests_waiting{'),
    kv: get('oasis:kv_cache_usage_perc{'),
    prompt: get('oasis:prompt_tokens_total{'),
    generation: get('oasis:generation_tokens_total{'),
    aborted: get('oasis:request_success_total{model_name="oasis-embedded",finished_reason="abort"}'),
    finished: ['stop', 'length', 'abort', 'error']
      .map((r) => get(`oasis:request_success_total{model_name="oasis-embedded",finished_reason="${r}"}`))
      .reduce((a, b) => a + b, 0),
    e2eCount: get('oasis:e2e_request_latency_seconds_count{'),
    hits: get('oasis:prefix_cache_hits_total{'),
  };
}

// Waits until nothing runs and the KV cache is empty; returns the metrics then.
async function idle(timeoutMs = 20000) {
  const end = Date.now() + timeoutMs;
  let m;
  while (Date.now() < end) {
    m = await metrics();
    if (m.running === 0 && m.waiting === 0 && m.kv === 0) return m;
    await sleep(50);
  }
  return m;
}

const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
const prompts = Array.from({ length: 32 }, (_, i) => `Request number ${i}: tell me about item ${i * 7}`);

async function openaiBasics() {
  const before = await idle();
  const usages = [];
  const c = await client.completions.create({ model: 'oasis-embedded', prompt: 'Hello, world', max_tokens: 8, temperature: 0, ignore_eos: true });
  check(c.object === 'text_completion' && c.choices.length === 1 && c.usage.completion_tokens === 8, 'openai: completions.create', c);
  usages.push(c.usage);
  const chat = await client.chat.completions.create({
    model: 'oasis-embedded', messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'What is 2+2?' }],
    max_tokens: 10, temperature: 0,
  });
  check(chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant' && typeof chat.choices[0].message.content === 'string',
    'openai: chat.completions.create', chat);
  usages.push(chat.usage);

  const stream = await client.completions.create({ model: 'oasis-embedded', prompt: 'Hello, world', max_tokens: 8, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    for (const ch of chunk.choices) text += ch.text;
    if (chunk.usage) usage = chunk.usage;
  }
  check(text === c.choices[0].text && chunks >= 2, 'openai: streamed completion equals the non-streamed one', { text, expected: c.choices[0].text });
  check(usage && usage.completion_tokens === 8 && usage.prompt_tokens === c.usage.prompt_tokens, 'openai: stream_options.include_usage', usage);
  usages.push(usage);

  const chatStream = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'What is 2+2?' }],
    max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let chatText = '', role = null, finish = null, chatUsage = null;
  for await (const chunk of chatStream) {
    for (const ch of chunk.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) chatText += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) chatUsage = chunk.usage;
  }
  const chatAgain = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'What is 2+2?' }], max_tokens: 10, temperature: 0 });
  check(role === 'assistant' && finish !== null && chatText === chatAgain.choices[0].message.content, 'openai: streamed chat', { chatText, finish });
  usages.push(chatUsage, chatAgain.usage);

  const nres = await client.completions.create({ model: 'oasis-embedded', prompt: 'abc', max_tokens: 5, n: 3, temperature: 1, seed: 3, ignore_eos: true });
  check(nres.choices.length === 3 && nres.usage.completion_tokens === 15, 'openai: n=3', nres);
  // OpenAI counts the prompt once for n > 1; the engine prefilled it n times.
  usages.push({ prompt_tokens: nres.usage.prompt_tokens * 3, completion_tokens: nres.usage.completion_tokens });

  try {
    await client.completions.create({ model: 'oasis-embedded', prompt: 'x', temperature: -1 });
    check(false, 'openai: temperature -1 rejected');
  } catch (e) {
    check(e.status === 400 && e.error?.message?.includes('temperature'), 'openai: BadRequestError for temperature -1', e.error);
  }
  try {
    await client.models.retrieve('oasis-embedded');
  } catch (e) { /* /v1/models/{id} is optional */ }
  const models = await client.models.list();
  check(models.data.some((m) => m.id === 'oasis-embedded'), 'openai: models.list');

  const after = await idle();
  const prompt = usages.reduce((a, u) => a + u.prompt_tokens, 0);
  const generated = usages.reduce((a, u) => a + u.completion_tokens, 0);
  check(after.prompt - before.prompt === prompt, 'metrics: prompt_tokens_total grew by the sum of usage.prompt_tokens',
    { delta: after.prompt - before.prompt, sum: prompt });
  check(after.generation - before.generation === generated, 'metrics: generation_tokens_total grew by the sum of usage.completion_tokens',
    { delta: after.generation - before.generation, sum: generated });
  check(after.finished - before.finished === 8 && after.e2eCount - before.e2eCount === 8,
    'metrics: 8 engine requests finished and were timed', { before, after });
}

async function streamText(prompt, maxTokens) {
  const s = await client.completions.create({ model: 'oasis-embedded', prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true });
  let text = '', finish = null;
  for await (const chunk of s) {
    for (const ch of chunk.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, finish };
}

async function concurrency() {
  const sequential = [];
  for (const p of prompts) {
    const r = await client.completions.create({ model: 'oasis-embedded', prompt: p, max_tokens: 24, temperature: 0, ignore_eos: true });
    sequential.push({ text: r.choices[0].text, finish: r.choices[0].finish_reason });
  }
  const t0 = Date.now();
  const concurrent = await Promise.all(prompts.map((p) => streamText(p, 24)));
  const mismatches = concurrent.map((c, i) => (c.text === sequential[i].text && c.finish === 'length' ? null : { i, got: c, want: sequential[i] }))
    .filter((x) => x);
  check(concurrent.length === 32 && mismatches.length === 0, `32 concurrent streams match their sequential greedy outputs (${Date.now() - t0} ms)`, mismatches);
  const m = await idle();
  check(m.kv === 0 && m.running === 0, 'every KV block is back after the concurrent run', m);
}

// Opens a raw HTTP request and destroys the socket once `untilBytes` bytes arrived (streaming)
// or after `afterMs` (non-streaming).
function disconnectMidway(body, { untilBytes = 0, afterMs = 0 }) {
  return new Promise((resolve) => {
    const req = http.request(`${baseUrl}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' } }, (res) => {
      let got = 0;
      res.on('data', (d) => {
        got += d.length;
        if (untilBytes > 0 && got >= untilBytes) {
          req.destroy();
          resolve(got);
        }
      });
      res.on('end', () => resolve(-1));
    });
    req.on('error', () => {});
    req.end(JSON.stringify(body));
    if (afterMs > 0) setTimeout(() => { req.destroy(); resolve(0); }, afterMs);
  });
}

async function aborts() {
  const before = await idle();
  // Streaming: read a little, then go away.
  const long = { prompt: 'Tell me a long story', max_tokens: 4000, temperature: 0, ignore_eos: true };
  const got = await disconnectMidway({ ...long, stream: true }, { untilBytes: 600 });
  check(got > 0, 'stream disconnected mid-way', got);
  let m = await idle();
  check(m.kv === 0 && m.running === 0, 'after a client disconnect mid-stream, KV usage is back to 0', m);
  check(m.aborted === before.aborted + 1, 'the disconnected stream counted as aborted', { before: before.aborted, after: m.aborted });
  check(m.generation - before.generation < 3900, 'it stopped generating early', m.generation - before.generation);

  // Non-streaming: the client gives up while the engine works.
  const before2 = m;
  const r = await disconnectMidway(long, { afterMs: 150 });
  check(r === 0, 'non-streaming request disconnected before its response', r);
  m = await idle();
  check(m.kv === 0 && m.aborted === before2.aborted + 1, 'a non-streaming disconnect aborts too and frees the KV', { before: before2.aborted, m });

  // The openai client's AbortController.
  const controller = new AbortController();
  const s = await client.completions.create({ ...long, model: 'oasis-embedded', stream: true }, { signal: controller.signal });
  let n = 0;
  try {
    for await (const chunk of s) {
      if (++n === 3) controller.abort();
    }
  } catch (e) { /* aborted */ }
  m = await idle();
  check(m.kv === 0 && m.aborted === before2.aborted + 2, 'openai AbortController aborts the request', m);
  const health = await fetch(`${baseUrl}/health`);
  check(health.status === 200, 'server healthy after the aborts');
}

function grpcClient(port = grpcPort) {
  const def = protoLoader.loadSync(protoFile, { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true });
  const proto = grpc.loadPackageDefinition(def).oasis.v1;
  return new proto.Oasis(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
}

async function grpcAuthTests() {
  const c = grpcClient(authGrpcPort);
  const withKey = new grpc.Metadata();
  withKey.add('authorization', 'Bearer s3cret');
  const call = (method, req, md) => new Promise((resolve) => c[method](req, md, (err, res) => resolve({ err, res })));
  let r = await call('ListModels', {}, new grpc.Metadata());
  check(r.err && r.err.code === grpc.status.UNAUTHENTICATED, 'gRPC without the key -> UNAUTHENTICATED', r.err?.code);
  r = await call('ListModels', {}, withKey);
  check(!r.err && r.res.models.length === 1, 'gRPC with the key', r.err?.details);
  const g = await new Promise((resolve) => {
    const s = c.Generate({ text: 'x', maxTokens: 2 });
    s.on('data', () => {});
    s.on('error', (e) => resolve(e));
    s.on('end', () => resolve(null));
  });
  check(g && g.code === grpc.status.UNAUTHENTICATED, 'gRPC Generate without the key -> UNAUTHENTICATED', g?.code);
  c.close();
}

function unary(c, method, req) {
  return new Promise((resolve, reject) => c[method](req, (err, res) => (err ? reject(err) : resolve(res))));
}

function generate(c, req, { cancelAfter = 0 } = {}) {
  return new Promise((resolve) => {
    const call = c.Generate(req);
    const out = { responses: [], error: null };
    call.on('data', (r) => {
      out.responses.push(r);
      if (cancelAfter > 0 && out.responses.length === cancelAfter) call.cancel();
    });
    call.on('error', (e) => { out.error = e; });
    call.on('close', () => resolve(out));
    call.on('end', () => resolve(out));
  });
}

async function grpcTests() {
  const c = grpcClient();
  const health = await unary(c, 'Health', {});
  check(health.status === 'SERVING', 'gRPC Health', health);
  const models = await unary(c, 'ListModels', {});
  check(models.models.length === 1 && models.models[0].id === 'oasis-embedded' && models.models[0].maxModelLen === 4096, 'gRPC ListModels', models);

  const g = await generate(c, { text: 'Hello, world', maxTokens: 8, ignoreEos: true, sampling: { temperature: 0 } });
  const last = g.responses[g.responses.length - 1];
  const ids = g.responses.flatMap((r) => r.tokenIds);
  const text = g.responses.map((r) => r.text).join('');
  const http = await client.completions.create({ model: 'oasis-embedded', prompt: 'Hello, world', max_tokens: 8, temperature: 0, ignore_eos: true });
  check(!g.error && ids.length === 8 && last.finished && last.finishReason === 'length' && last.usage.completionTokens === 8,
    'gRPC Generate streams 8 tokens and finishes', { error: g.error?.message, last });
  check(text === http.choices[0].text, 'gRPC and HTTP give the same greedy text', { grpc: text, http: http.choices[0].text });

  const byIds = await generate(c, { tokenIds: { ids: [1, 2, 3] }, maxTokens: 3, ignoreEos: true, logprobs: true, topLogprobs: 2 });
  const toks = byIds.responses.flatMap((r) => r.tokens);
  check(!byIds.error && toks.length === 3 && toks.every((t) => t.logprob <= 0 && t.topLogprobs.length === 2), 'gRPC token-id prompt with logprobs', byIds);

  // A chat prompt: the same greedy text as the HTTP chat route (raw: no reasoning parser here).
  const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'Hello there' }];
  const gc = await generate(c, { chat: { messages }, maxTokens: 8, ignoreEos: true, sampling: { temperature: 0 } });
  const httpChat = await client.chat.completions.create({ model: 'oasis-embedded', messages, max_tokens: 8, temperature: 0, ignore_eos: true, skip_special_tokens: true });
  const chatText = gc.responses.map((r) => r.text).join('');
  check(!gc.error && chatText === httpChat.choices[0].message.content &&
    gc.responses[gc.responses.length - 1].usage.promptTokens === httpChat.usage.prompt_tokens,
  'gRPC chat prompt gives the HTTP chat route\'s greedy text and prompt tokens', { error: gc.error?.message, grpc: chatText, http: httpChat.choices[0].message.content });
  // n = 3: every index, each finished once, its own tokens.
  const gn = await generate(c, { text: 'Once', maxTokens: 5, ignoreEos: true, n: 3, sampling: { temperature: 1, seed: 3 } });
  const byIndex = [0, 1, 2].map((i) => gn.responses.filter((r) => r.index === i));
  check(!gn.error && byIndex.every((rs) => rs.flatMap((r) => r.tokenIds).length === 5 && rs.filter((r) => r.finished).length === 1),
    'gRPC n = 3: three choices of 5 tokens, each finished once', { error: gn.error?.message, counts: byIndex.map((rs) => rs.length) });

  const expectCode = async (req, code, what) => {
    const r = await generate(c, req);
    check(r.error && r.error.code === code, `gRPC ${what} -> ${Object.keys(grpc.status).find((k) => grpc.status[k] === code)}`,
      r.error ? { code: r.error.code, details: r.error.details } : r.responses);
  };
  await expectCode({ text: 'x', sampling: { temperature: -1 } }, grpc.status.INVALID_ARGUMENT, 'temperature -1');
  await expectCode({ text: 'x', sampling: { topP: 0 } }, grpc.status.INVALID_ARGUMENT, 'top_p 0');
  await expectCode({ text: 'x', maxTokens: -4 }, grpc.status.INVALID_ARGUMENT, 'negative max_tokens');
  await expectCode({ tokenIds: { ids: Array.from({ length: 5000 }, () => 7) } }, grpc.status.INVALID_ARGUMENT, 'prompt longer than the context');
  await expectCode({ model: 'nope', text: 'x' }, grpc.status.NOT_FOUND, 'unknown model');
  await expectCode({}, grpc.status.INVALID_ARGUMENT, 'no prompt');
  await expectCode({ chat: { messages: [] } }, grpc.status.INVALID_ARGUMENT, 'chat without messages');
  await expectCode({ text: 'x', n: 0 }, grpc.status.INVALID_ARGUMENT, 'n 0');

  const before = await idle();
  const cancelled = await generate(c, { text: 'a long one', maxTokens: 4000, ignoreEos: true }, { cancelAfter: 3 });
  check(cancelled.error && cancelled.error.code === grpc.status.CANCELLED, 'gRPC call cancelled by the client', cancelled.error?.code);
  const m = await idle();
  check(m.kv === 0 && m.aborted === before.aborted + 1, 'gRPC cancellation aborts the request and frees its KV', { before: before.aborted, m });
  c.close();
}

// vLLM's extra parameters through the openai package (passed in the body as they are):
// prompt_logprobs, a per-request chat_template, spaces_between_special_tokens; streamed and not.
async function openaiVllmExtras() {
  const c = await client.completions.create({ model: 'oasis-embedded', prompt: 'Hello, world', max_tokens: 4, temperature: 0,
    prompt_logprobs: 2 });
  const plp = c.choices[0].prompt_logprobs;
  check(Array.isArray(plp) && plp.length === c.usage.prompt_tokens && plp[0] === null &&
        plp.slice(1).every((e) => Object.values(e).some((v) => v.rank === 1) && Object.values(e).every((v) => v.logprob <= 0)),
    'openai: completions with prompt_logprobs', plp);
  const template = '{% for m in messages %}<<{{ m.content }}>>{% endfor %}';
  const chat = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'What is 2+2?' }],
    max_tokens: 4, temperature: 0, chat_template: template, prompt_logprobs: 0, spaces_between_special_tokens: false });
  const tk = await (await fetch(`${baseUrl}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: '<<What is 2+2?>>', add_special_tokens: false }) })).json();
  check(chat.usage.prompt_tokens === tk.count && chat.prompt_logprobs.length === tk.count &&
        chat.prompt_logprobs.slice(1).every((e, i) => Object.keys(e).length === 1 && String(tk.tokens[i + 1]) in e),
    'openai: chat with chat_template, prompt_logprobs and spaces_between_special_tokens', { chat, tk });
  const stream = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'What is 2+2?' }],
    max_tokens: 4, temperature: 0, chat_template: template, spaces_between_special_tokens: false, stream: true });
  let text = '';
  for await (const chunk of stream) for (const ch of chunk.choices) text += ch.delta.content ?? '';
  check(text === chat.choices[0].message.content, 'openai: streamed chat with chat_template equals the non-streamed one',
    { text, expected: chat.choices[0].message.content });
  try {
    await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'x' }], chat_template: '{% if %}' });
    check(false, 'openai: a broken chat_template rejected');
  } catch (e) {
    check(e.status === 400 && e.error?.param === 'chat_template', 'openai: BadRequestError naming chat_template', e.error);
  }
}

// Automatic prefix caching (on by default): a prompt that repeats an earlier one's start reuses
// its full 16-token blocks, and every client sees it — the openai client as
// usage.prompt_tokens_details.cached_tokens, the gRPC client as usage.cachedTokens — with the
// same greedy tokens as the cold request and /metrics counting the hits.
async function prefixCaching() {
  const before = await metrics();
  const prefix = Array.from({ length: 600 }, (_, i) => ((i * 7919 + 17) % 500) + 3);
  const body = { model: 'oasis-embedded', max_tokens: 6, temperature: 0, ignore_eos: true };
  const cold = await client.completions.create({ ...body, prompt: [...prefix, 11] });
  const warm = await client.completions.create({ ...body, prompt: [...prefix, 11] });
  check(!cold.usage.prompt_tokens_details, 'prefix cache: a cold prompt has no prompt_tokens_details', cold.usage);
  check(warm.usage.prompt_tokens_details?.cached_tokens === 592 && warm.choices[0].text === cold.choices[0].text,
    'prefix cache: the repeated 601-token prompt reuses 592 cached tokens, same greedy text', { cold: cold.usage, warm: warm.usage });
  const other = await client.completions.create({ ...body, prompt: [...prefix.slice(0, 100), 42, 43, 44] });
  check(other.usage.prompt_tokens_details?.cached_tokens === 96, 'prefix cache: a prompt sharing 100 tokens reuses 6 blocks', other.usage);
  const salted = await client.completions.create({ ...body, prompt: [...prefix, 11], cache_salt: 'tenant-b' });
  check(!salted.usage.prompt_tokens_details && salted.choices[0].text === cold.choices[0].text,
    'prefix cache: another cache_salt shares nothing', salted.usage);
  const stream = await client.completions.create({ ...body, prompt: [...prefix, 11], stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  check(usage?.prompt_tokens_details?.cached_tokens === 592, 'prefix cache: the streamed usage chunk carries cached_tokens', usage);
  const system = 'You are a careful assistant. '.repeat(40);
  const chat = (q) => client.chat.completions.create({ model: 'oasis-embedded', max_tokens: 4, temperature: 0,
    messages: [{ role: 'system', content: system }, { role: 'user', content: q }] });
  const c1 = await chat('What is 2+2?');
  const c2 = await chat('Name a colour.');
  check((c2.usage.prompt_tokens_details?.cached_tokens ?? 0) >= 160 && c2.usage.prompt_tokens_details.cached_tokens < c2.usage.prompt_tokens,
    'prefix cache: a chat sharing a long system prompt reuses its blocks', { first: c1.usage, second: c2.usage });
  const c = grpcClient();
  const g = await generate(c, { tokenIds: { ids: [...prefix, 11] }, maxTokens: 6, ignoreEos: true, sampling: { temperature: 0 } });
  const last = g.responses[g.responses.length - 1];
  const ids = g.responses.flatMap((r) => r.tokenIds);
  const textIds = await client.completions.create({ ...body, prompt: [...prefix, 11], logprobs: 0 });
  check(!g.error && last.usage.cachedTokens === 592 && ids.length === 6, 'prefix cache: gRPC usage.cachedTokens', { error: g.error?.message, usage: last?.usage });
  check(textIds.usage.prompt_tokens_details?.cached_tokens === 592, 'prefix cache: HTTP again after gRPC', textIds.usage);
  c.close();
  const m = await idle();
  check(m.hits - before.hits >= 592 * 4 + 96 + 160, 'metrics: oasis:prefix_cache_hits_total counts the cached tokens', { before: before.hits, after: m.hits });
  check(m.kv === 0 && m.running === 0, 'prefix cache: with cached blocks parked, KV usage is back to 0 (they count as free)', { before, m });
}

// Structured output through the openai package (docs/structured_output.md): the answers parse
// and follow the schema whatever the sampled tokens (the embedded model knows no JSON; the
// masks make it), streamed or not; what cannot be honoured is a 400 naming the parameter.
async function structuredOutput() {
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 16 },
      age: { type: 'integer' },
      colour: { enum: ['red', 'green', 'blue'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 2 },
      nick: { anyOf: [{ type: 'string', maxLength: 8 }, { type: 'null' }] },
    },
    required: ['name', 'age', 'colour'],
    additionalProperties: false,
  };
  const follows = (v) =>
    v && typeof v === 'object' && !Array.isArray(v) && typeof v.name === 'string' && [...v.name].length <= 16 &&
    Number.isInteger(v.age) && ['red', 'green', 'blue'].includes(v.colour) &&
    Object.keys(v).every((k) => k in schema.properties) &&
    (v.tags === undefined || (Array.isArray(v.tags) && v.tags.length <= 2 && v.tags.every((t) => typeof t === 'string'))) &&
    (v.nick === undefined || v.nick === null || typeof v.nick === 'string');
  const format = { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } };
  let stopped = 0;
  for (let seed = 0; seed < 6; seed++) {
    const r = await client.chat.completions.create({
      model: 'oasis-embedded', messages: [{ role: 'user', content: 'Describe a person as JSON.' }],
      max_tokens: 400, temperature: 1.0, seed, response_format: format,
      structured_outputs: seed % 2 === 0 ? { disable_any_whitespace: true } : undefined,
    });
    const choice = r.choices[0];
    if (choice.finish_reason !== 'stop') continue;
    stopped++;
    let v = null;
    try { v = JSON.parse(choice.message.content); } catch (e) { /* checked below */ }
    check(follows(v), `structured: response_format json_schema, seed ${seed}: the answer parses and follows the schema`, choice.message.content);
    if (seed % 2 === 0) check(!/\s(?=(?:[^"]*"[^"]*")*[^"]*$)/.test(choice.message.content), 'structured: disable_any_whitespace gives compact JSON', choice.message.content);
  }
  check(stopped >= 3, 'structured: most answers end with EOS within max_tokens', stopped);
  // Streamed: the deltas join into the same kind of answer.
  const stream = await client.chat.completions.create({
    model: 'oasis-embedded', messages: [{ role: 'user', content: 'Another person.' }], max_tokens: 400,
    temperature: 0.8, seed: 11, stream: true, response_format: format, structured_outputs: { disable_any_whitespace: true } });
  let text = '', finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  let sv = null;
  try { sv = JSON.parse(text); } catch (e) { /* checked below */ }
  check(finish !== 'stop' || follows(sv), 'structured: a streamed json_schema answer parses and follows the schema', { finish, text });
  // json_object, completions with guided_choice and n.
  const obj = await client.chat.completions.create({
    model: 'oasis-embedded', messages: [{ role: 'user', content: 'Any JSON object.' }], max_tokens: 300, temperature: 0.9,
    seed: 5, response_format: { type: 'json_object' }, structured_outputs: undefined });
  const objText = obj.choices[0].message.content;
  let ov = null;
  try { ov = JSON.parse(objText); } catch (e) { /* checked below */ }
  check(obj.choices[0].finish_reason !== 'stop' || (ov && typeof ov === 'object' && !Array.isArray(ov)),
    'structured: response_format json_object gives an object', objText);
  const choices = ['yes', 'no', 'it depends'];
  const pick = await client.completions.create({ model: 'oasis-embedded', prompt: 'Will it rain?', max_tokens: 10, n: 4,
    temperature: 1.5, guided_choice: choices });
  check(pick.choices.length === 4 && pick.choices.every((c) => choices.includes(c.text) && c.finish_reason === 'stop'),
    'structured: guided_choice, n = 4: each answer is one of the choices', pick.choices.map((c) => c.text));
  // Regular expressions: guided_regex (n = 3), structured_outputs.regex, a schema's pattern.
  const re = await client.completions.create({ model: 'oasis-embedded', prompt: 'A code:', max_tokens: 40, n: 3,
    temperature: 1.2, seed: 9, guided_regex: '^\\d{3}-[a-zé]{2,5}(\\.(com|org))?$' });
  check(re.choices.every((c) => c.finish_reason === 'stop' && /^\d{3}-[a-zé]{2,5}(\.(com|org))?$/u.test(c.text)),
    'structured: guided_regex, n = 3: each answer matches the pattern', re.choices.map((c) => c.text));
  const reChat = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'Yes or no?' }],
    max_tokens: 20, temperature: 1.0, seed: 3, structured_outputs: { regex: '(yes|no)!{0,3}' } });
  check(/^(yes|no)!{0,3}$/.test(reChat.choices[0].message.content) && reChat.choices[0].finish_reason === 'stop',
    'structured: structured_outputs.regex', reChat.choices[0].message.content);
  const pat = await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'A flight.' }],
    max_tokens: 120, temperature: 1.0, seed: 4, response_format: { type: 'json_schema', json_schema: { name: 'f', schema: {
      type: 'object', properties: { code: { type: 'string', pattern: '^[A-Z]{3}"?\\d{2,4}$' },
        n: { type: 'integer', minimum: -5, exclusiveMaximum: 50 } }, required: ['code', 'n'] } } } });
  let pv = null;
  try { pv = JSON.parse(pat.choices[0].message.content); } catch (e) { /* checked below */ }
  check(pat.choices[0].finish_reason !== 'stop' || (pv && /^[A-Z]{3}"?\d{2,4}$/.test(pv.code) && Number.isInteger(pv.n) &&
    pv.n >= -5 && pv.n < 50), 'structured: a JSON schema\'s pattern and integer bounds hold in the parsed value',
    pat.choices[0].message.content);
  // A GBNF grammar (rules, groups, classes, bounded repeats: every answer must end), n = 3.
  const arith = 'root ::= term (op term){0,3}\nop ::= "+" | "-"\nterm ::= num | "(" num ("*" num){0,2} ")"\n' +
    'num ::= [0-9]{1,3}  # up to three digits';
  const arithRe = /^(\d{1,3}|\(\d{1,3}(\*\d{1,3}){0,2}\))([+-](\d{1,3}|\(\d{1,3}(\*\d{1,3}){0,2}\))){0,3}$/;
  const gr = await client.completions.create({ model: 'oasis-embedded', prompt: 'Some arithmetic:', max_tokens: 80, n: 3,
    temperature: 1.0, seed: 21, guided_grammar: arith });
  check(gr.choices.every((c) => c.finish_reason === 'stop' && arithRe.test(c.text)),
    'structured: guided_grammar (GBNF), n = 3: each answer is in the language', gr.choices.map((c) => [c.text, c.finish_reason]));
  // Refusals.
  const refused = async (body, param, words, what) => {
    try {
      await client.chat.completions.create({ model: 'oasis-embedded', messages: [{ role: 'user', content: 'x' }], max_tokens: 5, ...body });
      check(false, what);
    } catch (e) {
      check(e.status === 400 && e.error?.param === param && e.error?.message?.includes(words), what, e.error);
    }
  };
  await refused({ response_format: { type: 'json_schema', json_schema: { name: 'p', schema: { type: 'integer', multipleOf: 3 } } } },
    'response_format', "'multipleOf'", 'structured: a schema keyword it cannot honour is a 400 naming it');
  await refused({ guided_regex: '(a)\\1' }, 'guided_regex', 'backreferences', 'structured: a regex it cannot honour is a 400 saying why');
  await refused({ guided_grammar: 'root ::= a\na ::= "x" a' }, 'guided_grammar', 'can never end',
    'structured: a grammar that cannot end is a 400 saying why');
  await refused({ response_format: { type: 'json_object' }, guided_json: { type: 'object' } }, 'guided_json', 'only one kind',
    'structured: two kinds at once are refused');
  await refused({ response_format: { type: 'json_object' }, ignore_eos: true }, 'ignore_eos', 'cannot be combined',
    'structured: ignore_eos with a structure is refused');
  await refused({ guided_json: '{"type": "object"' }, 'guided_json', 'malformed', 'structured: a schema string that is not JSON is refused');
  await refused({ response_format: { type: 'json_schema' } }, 'response_format', "'json_schema'", 'structured: json_schema without a schema is refused');
  const m = await idle();
  check(m.kv === 0 && m.running === 0, 'structured: KV usage back to 0', m);
}

try {
  await openaiBasics();
  await prefixCaching();
  await openaiVllmExtras();
  await structuredOutput();
  await concurrency();
  await aborts();
  await grpcTests();
  if (authGrpcPort) await grpcAuthTests();
} catch (e) {
  failures++;
  console.log(`FAILED: exception ${e?.stack ?? e}`);
}
console.log(failures === 0 ? 'all client checks passed' : `${failures} client check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
