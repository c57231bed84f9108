// Streams a completion from nanoserve's FrontendService, using nothing but the .proto files:
//   node generate.js [--address HOST:PORT] [--ca FILE] [--token KEY] [--max-tokens N]
//                    [--temperature T] [--logprobs K] "prompt"
// --ca (env NANOSERVE_CA_FILE): connect over TLS, trusting this PEM CA bundle (`--ca system`: the
// system's roots). --token (env NANOSERVE_TOKEN, preferred: argv is visible to other users): sent
// as `authorization: Bearer KEY` on every call. Without --ca the connection is plaintext.
// With --logprobs, each token's logprob, text and top K alternatives go to stderr, one line each.
const fs = require("fs");
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const args = process.argv.slice(2);
const opts = {
  address: "127.0.0.1:50051",
  "max-tokens": "32",
  temperature: "0",
  ca: process.env.NANOSERVE_CA_FILE || "",
  token: process.env.NANOSERVE_TOKEN || "",
};
const prompt = [];
for (let i = 0; i < args.length; i++) {
  if (args[i].startsWith("--")) opts[args[i].slice(2)] = args[++i];
  else prompt.push(args[i]);
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
if (opts.logprobs !== undefined) sampling_params.logprobs = Number(opts.logprobs);
const call = client.Generate({ prompt: prompt.join(" "), sampling_params }, metadata);
call.on("data", (chunk) => {
  process.stdout.write(chunk.text);
  for (const t of chunk.logprobs || []) {
    const top = (t.top_logprobs || []).map((a) => `${JSON.stringify(a.text)}=${a.logprob.toFixed(4)}`);
    process.stderr.write(`${t.token_id}\t${t.logprob.toFixed(4)}\t${JSON.stringify(t.text)}\t${top.join(" ")}\n`);
  }
});
call.on("end", () => process.stdout.write("\n"));
call.on("error", (err) => {
  console.error(`\nerror: ${grpc.status[err.code]}: ${err.details}`);
  process.exitCode = 1;
});
