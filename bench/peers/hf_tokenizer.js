// Peer of `moeforge bench tokenizer`: Hugging Face's tokenizers library (npm `tokenizers`,
// Rust through its Node binding) on the same documents. Prints one JSON line of seconds:
// cold = first pass one document per call, serial = a second pass (warm caches),
// batch = encodeBatch of all documents (the library's own thread pool).
// usage: node hf_tokenizer.js TOKENIZER_JSON DOCUMENTS_JSONL
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', '..', 'tests', 'npm', 'node_modules', 'tokenizers'));

(async () => {
  const [file, input] = process.argv.slice(2);
  const docs = fs.readFileSync(input, 'utf8').split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
  const tokenizer = Tokenizer.fromFile(file);
  const options = { addSpecialTokens: false };
  const pass = async () => {
    const t0 = process.hrtime.bigint();
    let tokens = 0;
    for (const d of docs) tokens += (await tokenizer.encode(d, null, options)).getIds().length;
    return [Number(process.hrtime.bigint() - t0) / 1e9, tokens];
  };
  const [cold, tokens] = await pass();
  const [serial] = await pass();
  const t0 = process.hrtime.bigint();
  await tokenizer.encodeBatch(docs, options);
  const batch = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ cold_seconds: cold, serial_seconds: serial, batch_seconds: batch, tokens }));
})().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
