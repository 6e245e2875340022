// Tool calling and reasoning with the official `openai` npm client against an oasis-server
// started with --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3
// (by test_server_tools.sh). The tiny test model never writes a tool call by itself, so the
// answers are teacher-forced (`forced_output_ids`, the ids of a text from /tokenize): a
// `<tool_call>` answer streamed and not, the history round trip (assistant content null +
// tool_calls, a tool message, then a normal answer), parallel_tool_calls=false, tool_choice
// "none", a malformed call, and a `<think>` answer (reasoning_content), also with thinking off.
// Usage: node server_tools.mjs <base url> <node_modules dir>
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert';

const [baseUrl, modulesDir] = process.argv.slice(2);
const require = createRequire(path.join(modulesDir, 'noop.js'));
const OpenAI = require('openai').default ?? require('openai');
const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'unused', maxRetries: 0 });

let failures = 0;
function check(cond, what, detail) {
  if (cond) {
    console.log(`ok: ${what}`);
  } else {
    failures++;
    console.log(`FAILED: ${what}${detail !== undefined ? ': ' + JSON.stringify(detail).slice(0, 2000) : ''}`);
  }
}
const sameJson = (a, b) => {
  try { assert.deepStrictEqual(a, b); return true; } catch { return false; }
};

async function post(route, body) {
  const r = await fetch(`${baseUrl}${route}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return r.json();
}
// The token ids of `text`, checked to decode back to it exactly.
async function idsOf(text) {
  const t = await post('/tokenize', { prompt: text, add_special_tokens: false });
  const back = await post('/detokenize', { tokens: t.tokens });
  if (back.prompt !== text) throw new Error(`tokenize/detokenize does not round-trip ${JSON.stringify(text)}`);
  return t.tokens;
}

const model = 'oasis-embedded';
const tools = [{
  type: 'function',
  function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } } } },
}, {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string' } } } },
}];
const ask = { role: 'user', content: 'What is the weather in Zürich?' };
const args1 = { city: 'Zürich', unit: '°C' };
const args2 = { zone: 'Europe/Zurich' };
const call1 = `<tool_call>\n{"name": "get_weather", "arguments": ${JSON.stringify(args1).replace(/,/g, ', ').replace(/":/g, '": ')}}\n</tool_call>`;
const call2 = `<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Zurich"}}\n</tool_call>`;
const idPattern = /^chatcmpl-tool-[0-9a-f]{32}$/;

// A forced answer: exactly the ids, then the request ends (max_tokens).
async function forced(text, extra = {}) {
  const ids = await idsOf(text);
  return client.chat.completions.create({ model, messages: [ask], tools, temperature: 0, max_tokens: ids.length, forced_output_ids: ids, ...extra });
}
// The same streamed: the chunks' deltas put together.
async function forcedStream(text, extra = {}) {
  const ids = await idsOf(text);
  const stream = await client.chat.completions.create({ model, messages: [ask], tools, temperature: 0, max_tokens: ids.length, forced_output_ids: ids, stream: true, ...extra });
  const got = { content: '', reasoning: '', calls: [], finish: null, chunks: 0, firstCallDelta: null, badFragments: [] };
  for await (const chunk of stream) {
    got.chunks++;
    const c = chunk.choices[0];
    if (!c) continue;
    const d = c.delta ?? {};
    if (typeof d.content === 'string') got.content += d.content;
    if (typeof d.reasoning_content === 'string') got.reasoning += d.reasoning_content;
    for (const t of d.tool_calls ?? []) {
      if (t.id !== undefined) {
        if (got.firstCallDelta === null) got.firstCallDelta = t;
        got.calls[t.index] = { id: t.id, type: t.type, name: t.function.name, arguments: t.function.arguments ?? '' };
      } else {
        got.calls[t.index].arguments += t.function.arguments;
        // A fragment carries its index and function.arguments only.
        if (!sameJson(Object.keys(t).sort(), ['function', 'index']) || !sameJson(Object.keys(t.function), ['arguments'])) got.badFragments.push(t);
      }
    }
    if (c.finish_reason) got.finish = c.finish_reason;
  }
  return got;
}

async function toolCalls() {
  const r = await forced(`${call1}`);
  const m = r.choices[0].message;
  check(m.tool_calls?.length === 1 && m.tool_calls[0].type === 'function' && m.tool_calls[0].function.name === 'get_weather' &&
    sameJson(JSON.parse(m.tool_calls[0].function.arguments), args1), 'non-streamed: message.tool_calls with the call (unicode arguments)', m);
  check(idPattern.test(m.tool_calls?.[0]?.id ?? ''), 'non-streamed: tool call id chatcmpl-tool-<32 hex>', m.tool_calls);
  check(m.content === null, 'non-streamed: content null when the answer is only the call', m);
  check(r.choices[0].finish_reason === 'tool_calls', 'non-streamed: finish_reason tool_calls', r.choices[0]);

  const two = await forced(`Checking both.\n${call1}\n${call2}`);
  const m2 = two.choices[0].message;
  check(m2.tool_calls?.length === 2 && m2.tool_calls[1].function.name === 'get_time' && sameJson(JSON.parse(m2.tool_calls[1].function.arguments), args2) &&
    m2.tool_calls[0].id !== m2.tool_calls[1].id, 'non-streamed: two calls, distinct ids', m2);
  check(m2.content === 'Checking both.', 'non-streamed: the text before the calls is content', m2);

  const s = await forcedStream(`Checking both.\n${call1}\n${call2}`);
  check(s.calls.length === 2 && s.calls[0].name === 'get_weather' && s.calls[1].name === 'get_time' &&
    sameJson(JSON.parse(s.calls[0].arguments), args1) && sameJson(JSON.parse(s.calls[1].arguments), args2),
  'streamed: two calls put together from their deltas', s);
  check(s.firstCallDelta && s.firstCallDelta.index === 0 && idPattern.test(s.firstCallDelta.id) && s.firstCallDelta.type === 'function' &&
    s.firstCallDelta.function.name === 'get_weather', 'streamed: the first tool-call delta has index, id, type, function.name', s.firstCallDelta);
  // (How many fragments depends on how many tokens each engine event carries: a reader behind the
  // engine gets them merged. test_output_parsers checks the fragments token by token.)
  check(s.badFragments.length === 0, 'streamed: argument fragments are {index, function: {arguments}}', s.badFragments);
  check(s.content === 'Checking both.', 'streamed: content outside the calls, no partial tag leaked', s.content);
  check(s.finish === 'tool_calls', 'streamed: finish_reason tool_calls', s);

  // The client's own stream helper accumulates our deltas into a message.
  const ids = await idsOf(call1);
  const runner = client.chat.completions.stream({ model, messages: [ask], tools, temperature: 0, max_tokens: ids.length, forced_output_ids: ids });
  const final = await runner.finalChatCompletion();
  const fm = final.choices[0].message;
  check(fm.tool_calls?.length === 1 && fm.tool_calls[0].function.name === 'get_weather' && sameJson(JSON.parse(fm.tool_calls[0].function.arguments), args1) &&
    final.choices[0].finish_reason === 'tool_calls', 'openai stream helper: finalChatCompletion() has the call', final);

  // The round trip: the call goes back with content null, the tool answers, the model answers.
  const back = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 6,
    messages: [ask, { role: 'assistant', content: null, tool_calls: m.tool_calls }, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '18 degrees, sunny' }],
  });
  check(back.object === 'chat.completion' && back.choices[0].message.role === 'assistant' && back.usage.completion_tokens >= 1 &&
    back.choices[0].finish_reason !== 'tool_calls', 'round trip: assistant(content null, tool_calls) + tool message -> an answer', back);
  // Also with no content key at all, and a completed history continuing afterwards.
  const again = await client.chat.completions.create({
    model, tools, temperature: 0, max_tokens: 4,
    messages: [ask, { role: 'assistant', tool_calls: m2.tool_calls }, { role: 'tool', tool_call_id: m2.tool_calls[0].id, content: '18' },
      { role: 'tool', tool_call_id: m2.tool_calls[1].id, content: '14:00' }, { role: 'assistant', content: 'It is 18 degrees.' }, { role: 'user', content: 'Thanks' }],
  });
  check(again.object === 'chat.completion', 'round trip: no content key, two tool messages, more turns', again);

  const one = await forced(`${call1}\n${call2}`, { parallel_tool_calls: false });
  check(one.choices[0].message.tool_calls?.length === 1 && one.choices[0].message.tool_calls[0].function.name === 'get_weather',
    'parallel_tool_calls=false keeps the first call', one.choices[0].message);
  const none = await forced(call1, { tool_choice: 'none' });
  check(none.choices[0].message.content === call1 && !(none.choices[0].message.tool_calls?.length) && none.choices[0].finish_reason !== 'tool_calls',
    'tool_choice none: the call stays text', none.choices[0].message);
  const broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Zürich}}\n</tool_call>';
  const b = await forced(broken);
  check(b.choices[0].message.content === broken && b.choices[0].message.tool_calls.length === 0 && b.choices[0].finish_reason === 'length',
    'a call whose JSON does not parse stays content', b.choices[0].message);

  // Forced calls (tool_choice "required" / a named function): constrained decoding makes even the
  // embedded model call the tools; the arguments parse and follow the tool's schema.
  const bounded = [{
    type: 'function',
    function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['C', 'F'] } }, required: ['city', 'unit'] } },
  }, {
    type: 'function',
    function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } }, required: ['zone'] } },
  }];
  const validCall = (c) => {
    let a = null;
    try { a = JSON.parse(c.function.arguments); } catch (e) { return false; }
    if (!idPattern.test(c.id) || c.type !== 'function') return false;
    if (c.function.name === 'get_weather') return typeof a.city === 'string' && [...a.city].length <= 10 && ['C', 'F'].includes(a.unit) && Object.keys(a).length === 2;
    if (c.function.name === 'get_time') return typeof a.zone === 'string' && Object.keys(a).length === 1;
    return false;
  };
  for (const choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
    let complete = 0;
    for (let seed = 0; seed < 5; seed++) {
      const r = await client.chat.completions.create({ model, messages: [ask], tools: bounded, tool_choice: choice, max_tokens: 300, temperature: 0.8, seed,
        parallel_tool_calls: seed % 2 === 0 });
      const ch = r.choices[0];
      if (ch.finish_reason === 'length') continue;
      complete++;
      const calls = ch.message.tool_calls ?? [];
      check(ch.finish_reason === 'tool_calls' && ch.message.content === null && calls.length >= 1 && calls.every(validCall),
        `tool_choice ${JSON.stringify(choice)}, seed ${seed}: tool calls that follow the schemas`, ch);
      if (typeof choice === 'object' || seed % 2 === 1) check(calls.length === 1, `tool_choice ${JSON.stringify(choice)}, seed ${seed}: one call`, calls);
      if (typeof choice === 'object') check(calls.every((c) => c.function.name === 'get_time'), 'a named function: only it is called', calls);
    }
    check(complete >= 2, `tool_choice ${JSON.stringify(choice)}: most answers complete within max_tokens`, complete);
  }
  // Streamed: the call's deltas join into a valid call.
  const stream = await client.chat.completions.create({ model, messages: [ask], tools: bounded, max_tokens: 300, temperature: 0.8, seed: 3,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, stream: true });
  let sid = null, sname = null, sargs = '', sfinish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta;
    for (const tc of d?.tool_calls ?? []) {
      sid ??= tc.id;
      sname ??= tc.function?.name;
      sargs += tc.function?.arguments ?? '';
    }
    sfinish = chunk.choices[0]?.finish_reason ?? sfinish;
  }
  check(sfinish !== 'tool_calls' || validCall({ id: sid, type: 'function', function: { name: sname, arguments: sargs } }),
    'a streamed forced call: its deltas join into a valid call', { sfinish, sname, sargs });
  for (const [choice, param, words] of [[{ type: 'function', function: { name: 'nope' } }, 'tool_choice', 'not among'],
    ['required', 'ignore_eos', 'cannot be combined']]) {
    try {
      await client.chat.completions.create({ model, messages: [ask], tools, tool_choice: choice, max_tokens: 2, ignore_eos: param === 'ignore_eos' ? true : undefined });
      check(false, `tool_choice ${JSON.stringify(choice)} refused`);
    } catch (e) {
      check(e.status === 400 && e.error?.param === param && String(e.message).includes(words), `tool_choice ${JSON.stringify(choice)} -> 400 (${param})`, { status: e.status, error: e.error });
    }
  }
}

async function reasoning() {
  const text = '<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.';
  const r = await forced(text, { tools: undefined });
  const m = r.choices[0].message;
  check(m.reasoning_content === '\nThe user wants 2+2.\n' && m.content === '\n\nIt is 4.', 'non-streamed: reasoning_content split out of <think>', m);
  const s = await forcedStream(text, { tools: undefined });
  check(s.reasoning === '\nThe user wants 2+2.\n' && s.content === '\n\nIt is 4.', 'streamed: delta.reasoning_content, then content', s);
  const off = await forced(text, { tools: undefined, chat_template_kwargs: { enable_thinking: false } });
  check(off.choices[0].message.content === text && !off.choices[0].message.reasoning_content, 'enable_thinking false: no reasoning parsing', off.choices[0].message);
  // Thinking, then a tool call in the content.
  const both = await forced(`<think>\nNeed the weather.\n</think>\n\n${call1}`);
  const bm = both.choices[0].message;
  check(bm.reasoning_content === '\nNeed the weather.\n' && bm.tool_calls?.length === 1 && bm.content === null && both.choices[0].finish_reason === 'tool_calls',
    'reasoning then a tool call', bm);
}

try {
  await toolCalls();
  await reasoning();
} catch (e) {
  failures++;
  console.log(`FAILED: exception ${e.stack ?? e}`);
}
console.log(failures === 0 ? 'server_tools: all checks passed' : `server_tools: ${failures} check(s) failed`);
process.exit(failures === 0 ? 0 : 1);
