// Streams a completion from nanoserve's FrontendService, using nothing but the .proto files:
//   node generate.js [--address HOST:PORT] [--max-tokens N] [--temperature T] [--logprobs K] "prompt"
// With --logprobs, each token's logprob, text and top K alternatives go to stderr, one line each.
const path = require("path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const args = process.argv.slice(2);
const opts = { address: "127.0.0.1:50051", "max-tokens": "32", temperature: "0" };
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
const client = new FrontendService(opts.address, grpc.credentials.createInsecure());

const sampling_params = {
  max_tokens: Number(opts["max-tokens"]),
  temperature: Number(opts.temperature),
};
if (opts.logprobs !== undefined) sampling_params.logprobs = Number(opts.logprobs);
const call = client.Generate({ prompt: prompt.join(" "), sampling_params });
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
