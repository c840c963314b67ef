// Hugging Face's tokenizers library (npm `tokenizers`, the Rust implementation) as the
// reference for src/data/hf_tokenizer: reads one JSON string per line, writes one JSON object
// per line with the ids of encode(text, add_special_tokens = false) and decode(ids).
// A line {"decode": [ids]} decodes those ids instead; {"nfc": text} or {"nfkc": text} gives that
// normaliser's output as {"normalized": text} (TOKENIZER_JSON is then still read but not used).
// usage: node hf_tokenizer_reference.js TOKENIZER_JSON INPUT_JSONL OUTPUT_JSONL
const fs = require('fs');
const path = require('path');
const { Tokenizer, nfcNormalizer, nfkcNormalizer } = require(path.join(__dirname, '..', 'npm', 'node_modules', 'tokenizers'));

(async () => {
  const [file, input, output] = process.argv.slice(2);
  const tokenizer = Tokenizer.fromFile(file);
  const lines = fs.readFileSync(input, 'utf8').split('\n').filter((l) => l.length > 0);
  const normalizers = { nfc: nfcNormalizer(), nfkc: nfkcNormalizer() };
  const out = [];
  const started = process.hrtime.bigint();
  let bytes = 0;
  for (const line of lines) {
    const item = JSON.parse(line);
    if (typeof item === 'string') {
      const ids = (await tokenizer.encode(item, null, { addSpecialTokens: false })).getIds();
      bytes += Buffer.byteLength(item, 'utf8');
      out.push(JSON.stringify({ ids, decoded: await tokenizer.decode(ids, false) }));
    } else if (item.decode) {
      out.push(JSON.stringify({ decoded: await tokenizer.decode(item.decode, false) }));
    } else {
      const kind = item.nfc !== undefined ? 'nfc' : 'nfkc';
      out.push(JSON.stringify({ normalized: normalizers[kind].normalizeString(item[kind]) }));
    }
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  fs.writeFileSync(output, out.join('\n') + '\n');
  process.stderr.write(`reference: ${lines.length} lines, ${bytes} bytes in ${seconds.toFixed(3)} s\n`);
})().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});
