// llama.cpp as a test peer (node-llama-cpp's prebuilt CPU build; never downloads or builds).
// Reads a JSON request on stdin:
//   {"model": "m.gguf", "tokens": [ids], "texts": ["..."], "prompt": "...", "generate": n, "threads": 2,
//    "bench": {"prompt": P, "tokens": N, "vocab": V, "prefill": [lengths]}}
// and prints {"logits": [[...] per position of tokens], "tokens": [[ids] per text],
// "generated": "greedy continuation of prompt", "tokens_per_s": greedy decoding speed,
// "prefill_tokens_per_s": {length: prompt tokens per second}}. Each logits row is log softmax of llama.cpp's
// logits minus its mean over the vocabulary: the logits up to the one constant a softmax cannot
// see, so they compare with anyone's logits centred the same way. The KV cache is f32 (llama.cpp's
// default f16 cache would round every key and value), except in "bench", which times llama.cpp
// as users run it (its defaults) on the prompt `bench generate` gives its first row: token t =
// (7t + 1) mod V, P prompt + N generated tokens, prefill included, one run after a warm-up; and
// prompts of each "prefill" length (the same tokens) evaluated alone.
import { getLlama } from "node-llama-cpp";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const req = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: req.model, useMmap: false });
const out = { tokens: (req.texts ?? []).map((t) => Array.from(model.tokenize(t, false))) };

async function sequenceFor(length, exact = true) {
  const exactness = { flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" };
  const context = await model.createContext({
    contextSize: Math.max(64, length + 8),
    batchSize: Math.max(64, length),
    threads: req.threads ?? 2,
    ...(exact ? exactness : {}),
  });
  return [context, context.getSequence()];
}

if (req.tokens?.length) {
  const [context, sequence] = await sequenceFor(req.tokens.length);
  const all = { temperature: 1, minP: 0, topK: 0, topP: 1 };
  const input = req.tokens.map((t) => [t, { generateNext: { probabilities: true, options: all } }]);
  const results = await sequence.controlledEvaluate(input);
  out.logits = results.map((r, i) => {
    const probs = r?.next?.probabilities;
    if (!probs) throw new Error(`no probabilities for position ${i}`);
    const row = new Array(probs.size);
    for (const [token, p] of probs) row[token] = Math.log(p);
    const mean = row.reduce((a, b) => a + b, 0) / row.length;
    return row.map((v) => v - mean);
  });
  await context.dispose();
}

if (req.generate) {
  const prompt = model.tokenize(req.prompt, false);
  const [context, sequence] = await sequenceFor(prompt.length + req.generate);
  const generated = [];
  for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
    generated.push(token);
    if (generated.length >= req.generate) break;
  }
  out.generated = model.detokenize(generated);
  await context.dispose();
}
if (req.bench) {
  const { prompt, tokens, vocab, prefill = [] } = req.bench;
  const ids = Array.from({ length: prompt }, (_, t) => (7 * t + 1) % vocab);
  const [context, sequence] = await sequenceFor(Math.max(prompt + tokens, ...prefill), false);
  const run = async () => {
    await sequence.clearHistory();
    const t0 = performance.now();
    let n = 0;
    for await (const _ of sequence.evaluate(ids, { temperature: 0 })) if (++n >= tokens) break;
    return n / ((performance.now() - t0) / 1000);
  };
  await run();
  out.tokens_per_s = await run();
  // prompt processing: prompts of each length evaluated in one batch, no token generated; best of two after a warm-up
  out.prefill_tokens_per_s = {};
  for (const length of prefill) {
    const prompt = Array.from({ length }, (_, t) => (7 * t + 1) % vocab);
    const time = async () => {
      await sequence.clearHistory();
      const t0 = performance.now();
      await sequence.evaluateWithoutGeneratingNewTokens(prompt);
      return length / ((performance.now() - t0) / 1000);
    };
    await time();
    out.prefill_tokens_per_s[length] = Math.max(await time(), await time());
  }
  await context.dispose();
}
await model.dispose();
process.stdout.write(JSON.stringify(out));
