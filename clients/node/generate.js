// Streams a completion from nanoserve's FrontendService, using nothing but the .proto files:
//   node generate.js [--address HOST:PORT] [--ca FILE] [--token KEY] [--max-tokens N]
//                    [--temperature T] [--seed S] [--logprobs K] [--n N] [--priority P]
//                    [--stream-interval N]
//                    [--json-schema TEXT|@FILE | --regex TEXT | --grammar TEXT|@FILE |
//                     --json-object | --structural-tag TEXT|@FILE]
//                    [--logit-bias ID=BIAS]... [--allowed-token-ids ID[,ID...]]...
//                    [--chat [--separate-reasoning] [--tools FILE.json] [--[no-]thinking]
//                            [--tool-choice auto|none|required] [--tool-function NAME]
//                            [--no-parallel-tool-calls]] "prompt"
//   node generate.js [--address ...] --tokenize "text"        prints the text's token ids
//   node generate.js [--address ...] --detokenize ID [ID...]  prints the ids' text
// --ca (env NANOSERVE_CA_FILE): connect over TLS, trusting this PEM CA bundle (`--ca system`: the
// system's roots). --token (env NANOSERVE_TOKEN, preferred: argv is visible to other users): sent
// as `authorization: Bearer KEY` on every call. Without --ca the connection is plaintext.
// With --logprobs, each token's logprob, text and top K alternatives go to stderr, one line each.
// --n N > 1: the N completions are printed once all ended, each prefixed by "[index] ".
// One structured output option constrains the output (TEXT, or @FILE for the file's contents);
// --logit-bias (repeatable) adds BIAS to token ID's logit (100 forces it, -100 bans it);
// --allowed-token-ids (repeatable) samples only those ids. Ranges are the server's to check.
// --chat: the prompt is one user message to Chat; --separate-reasoning streams the model's
// reasoning to stderr; --tools FILE.json (an array of tools in OpenAI's shape) lets the model
// call them: each call is printed after the text as one JSON line (OpenAI's shape, plus "index"
// with --n > 1). --tool-choice required or --tool-function NAME makes it call (the server
// constrains the reply); a <tool_call> block the server could not parse is noted on stderr.
const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

// options without a value
const FLAGS = new Set([
  "chat", "separate-reasoning", "thinking", "no-thinking", "json-object", "tokenize", "detokenize",
  "no-parallel-tool-calls",
]);
// options with one; REPEATED ones collect every value
const OPTIONS = new Set([
  "address", "ca", "token", "max-tokens", "temperature", "seed", "logprobs", "n", "priority",
  "stream-interval",
  "tools", "tool-choice", "tool-function", "logit-bias", "allowed-token-ids",
  "json-schema", "regex", "grammar", "structural-tag",
]);
const REPEATED = new Set(["logit-bias", "allowed-token-ids"]);
// StructuredOutput's oneof: option -> field
const STRUCTURED = {
  "json-schema": "json_schema", regex: "regex", grammar: "grammar", "json-object": "json_object",
  "structural-tag": "structural_tag",
};
const CHAT_ONLY = [
  "separate-reasoning", "tools", "tool-choice", "tool-function", "thinking", "no-thinking",
  "no-parallel-tool-calls",
];
const TOOL_CHOICES = ["auto", "none", "required"];
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
let structured; // the structured output option given, if any
for (let i = 0; i < args.length; i++) {
  if (!args[i].startsWith("--")) {
    prompt.push(args[i]);
    continue;
  }
  const name = args[i].slice(2);
  if (FLAGS.has(name)) opts[name] = true;
  else if (!OPTIONS.has(name)) fail(`unknown option ${args[i]}`);
  else if (i + 1 === args.length) fail(`${args[i]} needs a value`);
  else if (REPEATED.has(name)) (opts[name] = opts[name] || []).push(args[++i]);
  else opts[name] = args[++i];
  if (STRUCTURED[name] === undefined) continue;
  if (structured !== undefined && structured !== name) {
    fail(`--${structured} and --${name} are mutually exclusive: one structured output per request`);
  }
  structured = name;
}

function fail(message) {
  console.error(`error: ${message}`);
  process.exit(2);
}

function integer(name) {
  const value = Number(opts[name]);
  if (!Number.isInteger(value)) fail(`--${name} must be an integer, got ${opts[name]}`);
  return value;
}

// A token id: a uint32 written in decimal.
function tokenId(text, option) {
  if (!/^\d+$/.test(text) || Number(text) >= 2 ** 32) fail(`${option}: not a token id: ${JSON.stringify(text)}`);
  return Number(text);
}

// TEXT, or @FILE's contents.
function textOrFile(name) {
  const value = opts[name];
  if (!value.startsWith("@")) return value;
  try {
    return fs.readFileSync(value.slice(1), "utf8");
  } catch (err) {
    return fail(`--${name}: cannot read ${value.slice(1)}: ${err.message}`);
  }
}

const n = Number(opts.n);
if (!Number.isInteger(n) || n < 1) fail(`--n must be a positive integer, got ${opts.n}`);
if (CHAT_ONLY.some((name) => opts[name] !== undefined) && !opts.chat) {
  fail(
    "--separate-reasoning, --tools, --tool-choice, --tool-function, --no-parallel-tool-calls and " +
      "--[no-]thinking need --chat",
  );
}
if (opts["tool-choice"] !== undefined && !TOOL_CHOICES.includes(opts["tool-choice"])) {
  fail(`--tool-choice must be one of ${TOOL_CHOICES.join(", ")}, got ${opts["tool-choice"]}`);
}
if (opts.thinking && opts["no-thinking"]) fail("--thinking and --no-thinking are mutually exclusive");
if (opts.tokenize && opts.detokenize) fail("--tokenize and --detokenize are mutually exclusive");
if ((opts.tokenize || opts.detokenize) && opts.chat) fail("--tokenize and --detokenize take no --chat");

// OpenAI's tool shape -> the proto's Tool: the parameters schema travels as a JSON string.
function readTools(file) {
  let tools;
  try {
    tools = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (err) {
    fail(`--tools: cannot read ${file}: ${err.message}`);
  }
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

// ID=BIAS options -> logit_bias's map (keyed by the id; a repeated id: the last one wins).
function logitBias(values) {
  const bias = {};
  for (const value of values) {
    const [id, number, extra] = value.split("=");
    if (number === undefined || extra !== undefined || number.trim() === "" || !Number.isFinite(Number(number))) {
      fail(`--logit-bias: expected ID=BIAS, e.g. 9707=100, got ${JSON.stringify(value)}`);
    }
    bias[tokenId(id, "--logit-bias")] = Number(number);
  }
  return bias;
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
  let roots = null;
  if (opts.ca !== "system") {
    try {
      roots = fs.readFileSync(opts.ca);
    } catch (err) {
      fail(`--ca: cannot read ${opts.ca}: ${err.message}`);
    }
  }
  try {
    credentials = grpc.credentials.createSsl(roots);
  } catch (err) {
    fail(`--ca: ${opts.ca} is not a PEM CA bundle: ${err.message}`);
  }
}
const metadata = new grpc.Metadata();
if (opts.token) metadata.set("authorization", `Bearer ${opts.token}`);
const client = new FrontendService(opts.address, credentials);

// A unary call's reply, printed; its error as the stream's are.
function unary(method, request, print) {
  client[method](request, metadata, (err, response) => {
    if (err) {
      console.error(`error: ${grpc.status[err.code]}: ${err.details}`);
      process.exitCode = 1;
    } else {
      process.stdout.write(`${print(response)}\n`);
    }
  });
}

if (opts.tokenize) {
  unary("Tokenize", { text: prompt.join(" ") }, (r) => (r.token_ids || []).join(" "));
} else if (opts.detokenize) {
  const ids = prompt.join(" ").split(/[\s,]+/).filter(Boolean).map((id) => tokenId(id, "--detokenize"));
  if (ids.length === 0) fail("--detokenize needs token ids, e.g. 9707 11");
  unary("Detokenize", { token_ids: ids }, (r) => r.text || "");
} else {
  generate();
}

function generate() {
  const sampling_params = {
    max_tokens: integer("max-tokens"),
    temperature: Number(opts.temperature),
  };
  if (!Number.isFinite(sampling_params.temperature)) fail(`--temperature must be a number, got ${opts.temperature}`);
  if (opts.seed !== undefined) sampling_params.seed = integer("seed");
  if (opts.logprobs !== undefined) sampling_params.logprobs = integer("logprobs");
  if (n > 1) sampling_params.n = n;
  if (structured !== undefined) {
    const value = structured === "json-object" ? true : textOrFile(structured);
    sampling_params.structured_output = { [STRUCTURED[structured]]: value };
  }
  if (opts["logit-bias"] !== undefined) sampling_params.logit_bias = logitBias(opts["logit-bias"]);
  if (opts["allowed-token-ids"] !== undefined) {
    sampling_params.allowed_token_ids = opts["allowed-token-ids"]
      .flatMap((ids) => ids.split(","))
      .map((id) => tokenId(id, "--allowed-token-ids"));
  }
  const request = { sampling_params };
  if (opts.priority !== undefined) request.priority = integer("priority");
  // a message per N tokens after the first (the server checks 1..256)
  if (opts["stream-interval"] !== undefined) request.stream_interval = integer("stream-interval");

  let call;
  if (opts.chat) {
    request.messages = [{ role: "user", content: prompt.join(" ") }];
    if (opts["separate-reasoning"]) request.separate_reasoning = true;
    if (opts.thinking || opts["no-thinking"]) request.enable_thinking = Boolean(opts.thinking);
    if (opts.tools !== undefined) request.tools = readTools(opts.tools);
    if (opts["tool-choice"] !== undefined) request.tool_choice = opts["tool-choice"];
    if (opts["tool-function"] !== undefined) request.tool_choice_function = opts["tool-function"];
    // at most one call per reply (OpenAI's parallel_tool_calls: false)
    if (opts["no-parallel-tool-calls"]) request.parallel_tool_calls = false;
    call = client.Chat(request, metadata);
  } else {
    request.prompt = prompt.join(" ");
    call = client.Generate(request, metadata);
  }

  const texts = Array.from({ length: n }, () => []); // n > 1: each completion's deltas, by index
  const toolCalls = [];
  let stderrOpen = false; // stderr's last write (reasoning) did not end its line
  call.on("data", (chunk) => {
    const index = chunk.index || 0;
    const text = chunk.text || ""; // proto3 defaults are left out (defaults: false)
    if (n > 1) texts[index].push(text);
    else process.stdout.write(text);
    if (chunk.reasoning_content) {
      process.stderr.write(chunk.reasoning_content);
      stderrOpen = !chunk.reasoning_content.endsWith("\n");
    }
    if (chunk.tool_call_parse_error) {
      const label = n > 1 ? `[${index}] ` : "";
      process.stderr.write(`${stderrOpen ? "\n" : ""}${label}warning: a <tool_call> block held no valid call\n`);
      stderrOpen = false;
    }
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
}
