// Streams a completion from nanoserve's FrontendService, using nothing but the .proto files:
//   node generate.js [--address HOST:PORT] [--ca FILE] [--token KEY] [--max-tokens N]
//                    [--temperature T] [--seed S] [--logprobs K] [--n N] [--priority P]
//                    [--chat [--separate-reasoning] [--tools FILE.json]] "prompt"
// --ca (env NANOSERVE_CA_FILE): connect over TLS, trusting this PEM CA bundle (`--ca system`: the
// system's roots). --token (env NANOSERVE_TOKEN, preferred: argv is visible to other users): sent
// as `authorization: Bearer KEY` on every call. Without --ca the connection is plaintext.
// With --logprobs, each token's logprob, text and top K alternatives go to stderr, one line each.
// --n N > 1: the N completions are printed once all ended, each prefixed by "[index] ".
// --chat: the prompt is one user message to Chat; --separate-reasoning streams the model's
// reasoning to stderr; --tools FILE.json (an array of tools in OpenAI's shape) lets the model
// call them: each call is printed after the text as one JSON line (OpenAI's shape, plus "index"
// with --n > 1).
const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const FLAGS = new Set(["chat", "separate-reasoning"]); // options without a value
const MAX_TOOLS = 128; // the frontend's bound too; checked here before the file is walked

const args = process.argv.slice(2);
const opts = {
  address: "127.0.0.1:50051",
  "max-tokens": "32",
  temperature: "0",
  n: "1",
  ca: process.env.NANOSERVE_CA_FILE || "",
  token: process.env.NANOSERVE_TOKEN || "",
};
const prompt = [];
for (let i = 0; i < args.length; i++) {
  if (!args[i].startsWith("--")) prompt.push(args[i]);
  else if (FLAGS.has(args[i].slice(2))) opts[args[i].slice(2)] = true;
  else opts[args[i].slice(2)] = args[++i];
}

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(2);
}

const n = Number(opts.n);
if (!Number.isInteger(n) || n < 1) fail(`--n must be a positive integer, got ${opts.n}`);
if ((opts["separate-reasoning"] || opts.tools !== undefined) && !opts.chat) {
  fail("--separate-reasoning and --tools need --chat");
}

// OpenAI's tool shape -> the proto's Tool: the parameters schema travels as a JSON string.
function readTools(file) {
  const tools = JSON.parse(fs.readFileSync(file, "utf8"));
  if (!Array.isArray(tools) || tools.length > MAX_TOOLS) {
    fail(`--tools: ${file} must hold a JSON array of at most ${MAX_TOOLS} tools`);
  }
  return tools.map((tool) => {
    const fn = (tool && tool.function) || {};
    return {
      type: tool.type || "function",
      function: {
        name: String(fn.name || ""),
        description: String(fn.description || ""),
        parameters: fn.parameters === undefined ? "" : JSON.stringify(fn.parameters),
      },
    };
  });
}

const protos = path.join(__dirname, "..", "..", "protos");
const definition = protoLoader.loadSync("nanoserve/v1/frontend_service.proto", {
  includeDirs: [protos], keepCase: true, longs: Number, enums: String, defaults: false,
});
const { FrontendService } = grpc.loadPackageDefinition(definition).nanoserve.v1;

// Transport: TLS with the given roots, or plaintext. The token travels as call metadata (not
// grpc-js call credentials, which it sends only over TLS), so a loopback test works without TLS;
// anywhere else, give --ca: in plaintext the token is readable on the wire.
let credentials = grpc.credentials.createInsecure();
if (opts.ca) {
  const roots = opts.ca === "system" ? null : fs.readFileSync(opts.ca);
  credentials = grpc.credentials.createSsl(roots);
}
const metadata = new grpc.Metadata();
if (opts.token) metadata.set("authorization", `Bearer ${opts.token}`);
const client = new FrontendService(opts.address, credentials);

const sampling_params = {
  max_tokens: Number(opts["max-tokens"]),
  temperature: Number(opts.temperature),
};
if (opts.seed !== undefined) sampling_params.seed = Number(opts.seed);
if (opts.logprobs !== undefined) sampling_params.logprobs = Number(opts.logprobs);
if (n > 1) sampling_params.n = n;
const request = { sampling_params };
if (opts.priority !== undefined) request.priority = Number(opts.priority);

let call;
if (opts.chat) {
  request.messages = [{ role: "user", content: prompt.join(" ") }];
  if (opts["separate-reasoning"]) request.separate_reasoning = true;
  if (opts.tools !== undefined) request.tools = readTools(opts.tools);
  call = client.Chat(request, metadata);
} else {
  request.prompt = prompt.join(" ");
  call = client.Generate(request, metadata);
}

const texts = Array.from({ length: n }, () => []); // n > 1: each completion's deltas, by index
const toolCalls = [];
call.on("data", (chunk) => {
  const index = chunk.index || 0;
  const text = chunk.text || ""; // proto3 defaults are left out (defaults: false)
  if (n > 1) texts[index].push(text);
  else process.stdout.write(text);
  if (chunk.reasoning_content) process.stderr.write(chunk.reasoning_content);
  for (const c of chunk.tool_calls || []) {
    const fn = c.function || {};
    const line = { id: c.id, type: c.type || "function", function: { name: fn.name, arguments: fn.arguments } };
    toolCalls.push(n > 1 ? { index, ...line } : line);
  }
  for (const t of chunk.logprobs || []) {
    const top = (t.top_logprobs || []).map((a) => `${JSON.stringify(a.text)}=${a.logprob.toFixed(4)}`);
    process.stderr.write(`${t.token_id}\t${t.logprob.toFixed(4)}\t${JSON.stringify(t.text)}\t${top.join(" ")}\n`);
  }
});
call.on("end", () => {
  if (n > 1) texts.forEach((deltas, index) => process.stdout.write(`[${index}] ${deltas.join("")}\n`));
  else process.stdout.write("\n");
  for (const line of toolCalls) process.stdout.write(`${JSON.stringify(line)}\n`);
});
call.on("error", (err) => {
  console.error(`\nerror: ${grpc.status[err.code]}: ${err.details}`);
  process.exitCode = 1;
});
