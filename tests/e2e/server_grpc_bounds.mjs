// oasis-server's gRPC bounds with a real client (@grpc/grpc-js), against a server started by
// test_server_clients.sh with --grpc-max-concurrent-calls 2: the standard grpc.health.v1
// service says SERVING, two live streams (the client reads one response each, then nothing)
// fill the cap and a third call gets RESOURCE_EXHAUSTED at once; then SIGTERM with the two
// streams live: both end with an error status (the script's caller checks that the server
// exits 0 within its shutdown timeout).
// Usage: node server_grpc_bounds.mjs <grpc port> <proto dir> <node_modules dir> <server pid>
import { createRequire } from 'node:module';
import path from 'node:path';

const [grpcPort, protoDir, modulesDir, serverPid] = process.argv.slice(2);
const require = createRequire(path.join(modulesDir, 'noop.js'));
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
const load = (file) => grpc.loadPackageDefinition(protoLoader.loadSync(file,
  { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true }));
const address = `127.0.0.1:${grpcPort}`;
const oasis = new (load(path.join(protoDir, 'proto/oasis.proto')).oasis.v1.Oasis)(address, grpc.credentials.createInsecure());
const health = new (load(path.join(protoDir, 'tests/unit/server/proto/health.proto')).grpc.health.v1.Health)(
  address, grpc.credentials.createInsecure());
const deadline = (ms) => ({ deadline: new Date(Date.now() + ms) });

const status = await new Promise((resolve) => health.Check({ service: '' }, deadline(10000),
  (err, res) => resolve(err ? `error ${err.code}` : res.status)));
check(status === 'SERVING', 'grpc.health.v1 Check says SERVING', status);

// An error that quotes a 100 KB model name stays small (a status that large never reached the
// client and stalled its whole connection), and the channel goes on serving.
const unary = (req) => new Promise((resolve) => {
  const call = oasis.Generate(req, deadline(10000));
  let got = 0;
  call.on('data', () => got++);
  call.on('error', (e) => resolve({ code: e.code, len: e.details.length, got }));
  call.on('end', () => resolve({ code: 0, got }));
});
const big = await unary({ model: 'm'.repeat(100000), tokenIds: { ids: [1, 2, 3] }, maxTokens: 2 });
check(big.code === grpc.status.NOT_FOUND && big.len > 0 && big.len <= 2048,
  'a 100 KB model name -> NOT_FOUND with a bounded message', big);
const after = await unary({ tokenIds: { ids: [1, 2, 3] }, maxTokens: 2 });
check(after.code === 0 && after.got > 0, 'the same channel then serves a request', after);

// A whole-context request with 20 logprobs a token: far more than the client buffers unread.
const long = { tokenIds: { ids: [5, 17, 42, 99] }, maxTokens: 4000, ignoreEos: true, logprobs: true, topLogprobs: 20 };
function openStream() {
  const call = oasis.Generate(long);
  const s = { call, error: null, ended: false };
  s.first = new Promise((resolve) => call.once('data', () => { call.pause(); resolve(true); }));
  s.done = new Promise((resolve) => {
    call.on('error', (e) => { s.error = e; });
    call.on('status', () => resolve());
    call.on('end', () => { s.ended = true; });
  });
  return s;
}
const streams = [openStream(), openStream()];
await Promise.all(streams.map((s) => s.first));

const t0 = Date.now();
const third = await new Promise((resolve) => {
  const call = oasis.Generate({ tokenIds: { ids: [1, 2, 3] }, maxTokens: 2 }, deadline(10000));
  let got = 0;
  call.on('data', () => got++);
  call.on('error', (e) => resolve({ code: e.code, details: e.details, got }));
  call.on('end', () => resolve({ code: 0, got }));
});
check(third.code === grpc.status.RESOURCE_EXHAUSTED && third.details.includes('--grpc-max-concurrent-calls') && third.got === 0,
  'a third stream past --grpc-max-concurrent-calls 2 -> RESOURCE_EXHAUSTED with a message', third);
check(Date.now() - t0 < 5000, 'refused at once', Date.now() - t0);

process.kill(Number(serverPid), 'SIGTERM');
for (const s of streams) s.call.resume();  // read what was sent; the status follows
const ended = await Promise.race([Promise.all(streams.map((s) => s.done)).then(() => true),
  new Promise((r) => setTimeout(() => r(false), 20000))]);
check(ended, 'live streams end after SIGTERM');
for (const s of streams) {
  check(s.error && s.error.code !== grpc.status.OK && s.error.details !== '',
    'a live stream ends with an error status and a message on shutdown', s.error && { code: s.error.code, details: s.error.details });
}
oasis.close();
health.close();
console.log(failures === 0 ? 'all gRPC bounds checks passed' : `${failures} gRPC bounds check(s) FAILED`);
process.exit(failures === 0 ? 0 : 1);
